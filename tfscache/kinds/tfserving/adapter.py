"""The TF Serving node adapter: the cache's wanted set as full-replacement ModelServerConfigs.

TF Serving is told what to serve by HandleReloadConfigRequest with the whole
``model_config_list`` (every model, each with ``specific`` versions). Its hazards
(docs/upstream/tfserving.md, "Blocking semantics" to "Hazards that follow from the ordering")
are defused here, so the reloader need not know them:

* a base path that vanished is never sent (it would wedge the node): a version whose
  directory is gone is reported NOT_FOUND instead of being loaded;
* a reload only waits for newly named models, and a removed-then-re-added model can
  fail that wait and load anyway: GetModelStatus, not the reload's result, decides
  whether a version loaded (AVAILABLE, or END with its error);
* a failed version stays aspired and sticky: the config is sent again without it;
* an unload is done when GetModelStatus reports END (or forgets the version).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.kinds.tfserving.client import AVAILABLE, END, NodeClient
from tfscache.kinds.nodepid import NodeMemory
from tfscache.repository.local import ModelRepository, not_found
from tfscache.wire import serving_pb2 as pb

log = logging.getLogger("tfscache.cache")

_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.05


class TFServingAdapter:
    """One TF Serving node (real, or `tfscache node`) behind its ModelService."""

    sizes_on_disk = True  # whether a model's size on disk predicts its memory (cache.adapter)
    # one reload waits for every model it adds: a batch's loads end together (cache.adapter)
    loads_apart = False
    demotes_in_place = False  # TF Serving cannot change a model's devices in place (cache.adapter)
    lost_texts = ("Servable not found for request",)  # a model not in its config (cache.adapter)

    def __init__(
        self,
        client: NodeClient,
        repository: ModelRepository,
        *,
        rpc_deadline_s: float = 10.0,
        memory: NodeMemory | None = None,
    ) -> None:
        self.client = client
        self.target = client.target
        self.repository = repository
        self.rpc_deadline_s = rpc_deadline_s
        self._memory = memory or NodeMemory(None)

    @staticmethod
    def missing(error: errors.ModelNotFound) -> errors.ModelNotFound:
        """TF Serving's NOT_FOUND for a ModelSpec that names no servable (ServableRequest's
        DebugString: ``Latest(NAME)`` or ``Specific(NAME, V)``), for a repository's neutral one."""
        if not getattr(error, "neutral", False):
            return error
        spec = (f"Latest({error.name})" if error.version is None
                else f"Specific({error.name}, {error.version})")
        return type(error)(f"Servable not found for request: {spec}", name=error.name,
                           version=error.version)

    def config(self, wanted: Sequence[Key]) -> pb.ModelServerConfig:
        """The node config serving exactly ``wanted``: one entry per name, its specific versions."""
        versions: dict[str, list[int]] = {}
        for name, version in wanted:
            versions.setdefault(name, []).append(version)
        config = pb.ModelServerConfig()
        config.model_config_list.SetInParent()
        for name in sorted(versions):
            model = config.model_config_list.config.add(
                name=name,
                base_path=str(self.repository.base_path(name)),
                model_platform="tensorflow",
            )
            model.model_version_policy.specific.versions.extend(sorted(versions[name]))
        return config

    async def wait_ready(self, timeout: float) -> bool:
        return await self.client.wait_ready(timeout)

    async def sync(self, wanted: Sequence[Key], deadline_s: float) -> None:
        await self.client.reload(self.config(wanted), deadline_s=deadline_s)

    async def load(self, keys: Sequence[Key], wanted: Sequence[Key],
                   deadline_s: float) -> dict[Key, Exception | None]:
        results: dict[Key, Exception | None] = {}
        # its directory may have gone since it was asked for
        gone = await asyncio.to_thread(self.repository.vanished, keys)
        for key in gone:
            results[key] = self.missing(not_found(*key))
        keys = [k for k in keys if k not in gone]
        wanted = [k for k in wanted if k not in gone]
        if not keys:
            return results
        started = time.monotonic()
        try:
            await self.client.reload(self.config(wanted), deadline_s=deadline_s)
        except (errors.DeadlineExceeded, errors.Unavailable):
            raise
        except errors.TfscacheError as e:
            # Trust GetModelStatus, not this (a re-added model can fail the wait and load anyway).
            log.info("node %s: reload loading %s returned %s: %s; checking status",
                     self.target, _names(keys), e.grpc_code.name, e.message)
        deadline = started + deadline_s
        states = await asyncio.gather(
            *(self._await_state(k, deadline, deadline_s, want_end=False) for k in keys),
            return_exceptions=True,
        )
        results.update(zip(keys, states))
        failed = [k for k in keys if results[k] is not None]
        if failed and not any(isinstance(results[k], errors.Unavailable) for k in failed):
            try:  # a failed version stays aspired and sticky on the node unless removed
                await self.client.reload(self.config([k for k in wanted if k not in failed]),
                                         deadline_s=self.rpc_deadline_s)
            except errors.TfscacheError as e:
                log.warning("node %s: removing failed %s: %s: %s", self.target, _names(failed),
                            e.grpc_code.name, e.message)
        return results

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        await self.client.reload(self.config(wanted), deadline_s=self.rpc_deadline_s)
        deadline = time.monotonic() + deadline_s
        await asyncio.gather(
            *(self._await_state(k, deadline, deadline_s, want_end=True) for k in keys)
        )

    async def available(self, key: Key, deadline_s: float) -> bool:
        statuses = await self.client.status(*key, deadline_s=deadline_s)
        return any(st.version == key[1] and st.state == AVAILABLE for st in statuses)

    @property
    def node_pid(self) -> int | None:
        """The node process measured (found again when it was replaced), if known."""
        return self._memory.pid

    def memory(self) -> int | None:
        return self._memory.rss()

    def restarted(self) -> bool:
        return self._memory.replaced()

    async def _await_state(
        self, key: Key, deadline: float, within: float, *, want_end: bool
    ) -> None:
        """Poll GetModelStatus until ``key`` is END (``want_end``) or AVAILABLE.

        Only a fallback: a load's reload returns once the model settled, so the first
        answer nearly always decides. A version that ends in error raises that error.
        """
        name, version = key
        delay = _FIRST_POLL_S
        while True:
            statuses = await self.client.status(name, version, deadline_s=self.rpc_deadline_s)
            status = next((st for st in statuses if st.version == version), None)
            if want_end:
                if status is None or status.state == END:
                    return
            elif status is not None:
                if status.state == AVAILABLE:
                    return None
                if status.state == END and status.status.error_code:
                    raise errors.error_for_code(
                        status.status.error_code, status.status.error_message
                    )
            if time.monotonic() + delay > deadline:
                state = "END" if want_end else "AVAILABLE"
                raise errors.DeadlineExceeded(
                    f"model {name} version {version} did not reach {state} on node "
                    f"{self.target} within {within} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_POLL_S)


def _names(keys: Sequence[Key]) -> str:
    return ", ".join(f"{n}:{v}" for n, v in keys)
