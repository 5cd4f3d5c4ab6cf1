"""The MLServer node adapter: the cache's wanted set as per-model repository loads and unloads.

MLServer (started with ``load_models_at_startup`` false, tfscache.kinds.mlserver.launcher) is
told what to serve one model name at a time through the repository extension of its gRPC
``inference.GRPCInferenceService`` (tfscache.kinds.mlserver.client). A key is ``(name,
version)``: the version directory ``NAME/V/`` whose ``model-settings.json`` says
``parameters.version = "V"``. What MLServer does, and what the adapter makes of it
(docs/mlserver.md, "Behaviour"):

* a flat model (``NAME/model-settings.json``, no version folder: tfscache.kinds.mlserver.layout)
  is the key ``(name, FLAT_VERSION)``; MLServer knows its version by ``parameters.version``
  (``repository.version_name``), which ModelReady is asked with;
* a load of a name loads every version of it in the repository and returns once they are
  loaded, or fails with the runtime's exception text (INTERNAL) after dropping the model;
  the adapter then confirms the key's version with ModelReady;
* an unload of a name unloads every version, in every inference worker, before it returns;
  the adapter confirms in the index that no version is READY (or UNKNOWN: still loading), so
  a victim counts against the caps until its worker let go of it;
* MLServer has no per-model lock: a load and an unload of one name that overlap leave it in
  either state (the registry is changed before the worker finishes). Loads and unloads are
  serialized per name here (one lock per name, held until the unload is confirmed);
* a load has no timeout on the node, and a gRPC deadline would cancel the handler half-way
  (leaving a model registered and never ready): each load RPC is sent with a generous deadline
  and the caller waits for it only until the cache's deadline; past it, the key is
  DEADLINE_EXCEEDED and a background task keeps the name's turn until the load ends, then
  unloads it;
* memory is the RSS of the ``mlserver`` process and every process under it: with
  ``parallel_workers`` >= 1 (the default, 1) the models live in the inference workers,
  children of the server.

What both OIP kinds share (turns per name, deadlines, abandoned loads) is
``tfscache.kinds.oip.adapter.OipAdapter``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.kinds.mlserver.client import READY, UNKNOWN, MLServerClient
from tfscache.kinds.oip.adapter import OipAdapter, left

log = logging.getLogger("tfscache.kinds.mlserver.adapter")

_LOAD_RPC_S = 3600.0  # a load RPC's own deadline: long, so that gRPC never cancels a load half-way
_PRESENT = (READY, UNKNOWN)  # a version holding (or about to hold) memory


def model_not_found(name: str, version: int | None = None) -> errors.ModelNotFound:
    """MLServer's NOT_FOUND text (mlserver.errors.ModelNotFound) for a model or version."""
    if version is None:
        return errors.ModelNotFound(f"Model {name} not found")
    return errors.ModelNotFound(f"Model {name} with version {version} not found")


class MLServerAdapter(OipAdapter):
    """One MLServer node behind its gRPC repository API (``MLServerClient``)."""

    client: MLServerClient
    # MLServer's NOT_FOUND for a model it does not hold ("Model NAME not found", "Model NAME with
    # version V not found"): the only 404/NOT_FOUND it sends (mlserver.errors.ModelNotFound).
    lost_texts = ("Model ",)
    product = "MLServer"
    log = log

    def _vanished(self, key: Key) -> errors.TfscacheError:
        return model_not_found(*key)

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        staying = {name for name, _ in wanted}
        # An unload drops every version of a name: a name with a version still wanted stays.
        names = sorted({name for name, _ in keys} - staying)
        async with self._turns_of(names, deadline, deadline_s):
            await asyncio.gather(*(self._unload_name(name, deadline) for name in names))
            index = await self.client.index(deadline_s=self._rpc_left(deadline))
            present = {e.name: e.state for e in index if e.name in names and e.state in _PRESENT}
            if present:
                shown = ", ".join(f"{n} is {s}" for n, s in sorted(present.items()))
                raise errors.Aborted(f"unloading on node {self.target}: {shown} after its unload "
                                     f"returned (another client loaded it again?)")

    async def available(self, key: Key, deadline_s: float) -> bool:
        name, version = key
        named = await asyncio.to_thread(self.repository.version_name, name, version)
        return await self.client.model_ready(name, named, deadline_s=deadline_s)

    async def _index_keys(self, index) -> set[Key]:
        """A flat model's entry carries its version's name ("v1", or ""): the repository's key."""
        def keys() -> set[Key]:
            found = set()
            for e in index:
                version = self.repository.version_of(e.name, e.version)
                if version is not None:
                    found.add((e.name, version))
            return found
        return await asyncio.to_thread(keys)

    async def _load_in_turn(self, key: Key, wanted: Sequence[Key], deadline: float,
                            within: float, handed_over: list[bool]) -> None:
        """Send the load and confirm the version ready; raises the key's error."""
        name, version = key
        rpc = asyncio.ensure_future(self.client.load(name, deadline_s=max(_LOAD_RPC_S, within)))
        try:
            await asyncio.wait_for(asyncio.shield(rpc), left(deadline))
        except asyncio.CancelledError:
            # The caller gave up; the node goes on loading.
            handed_over[0] = self._abandon(name, self._unload_when_loaded(name, rpc))
            raise
        except TimeoutError:
            handed_over[0] = self._abandon(name, self._unload_when_loaded(name, rpc))
            raise self._late(name, version, within) from None
        except errors.NotFound as e:
            raise errors.ModelNotFound(
                f"{e.message} (model {name} version {version} is not in the "
                f"repository of node {self.target})"
            ) from e
        except errors.Unavailable:
            raise
        # the channel closed, the node went away
        except (errors.Cancelled, errors.DeadlineExceeded) as e:
            raise errors.NodeUnavailable(
                f"node {self.target}: the load of model {name} version {version} ended "
                f"{e.grpc_code.name} (the node went away?)") from e
        except errors.TfscacheError as e:
            raise type(e)(f"load failed for model '{name}' version {version} on node "
                          f"{self.target}: {e.message}") from e
        named = await asyncio.to_thread(self.repository.version_name, name, version)
        if not await self.client.model_ready(
            name, named, deadline_s=self._rpc_left(deadline)
        ):
            raise errors.FailedPrecondition(
                f"model {name} version {version} is not served by node {self.target} after its load: "
                f"MLServer names versions by parameters.version in model-settings.json, which must be "
                f'"{version}", the version directory\'s name'
            )

    async def _unload_name(self, name: str, deadline: float) -> None:
        try:
            await self.client.unload(name, deadline_s=self._rpc_left(deadline))
        except errors.NotFound:
            pass  # nothing of it loaded: gone already

    async def _unload_when_loaded(self, name: str, rpc: asyncio.Future) -> None:
        """Wait for the abandoned load RPC of ``name`` to end, then unload it."""
        try:
            try:
                await rpc
            except errors.TfscacheError as e:
                log.info(
                    "node %s: the abandoned load of model %s ended: %s",
                    self.target,
                    name,
                    e.message,
                )
            try:
                await self._unload_name(name, time.monotonic() + self.rpc_deadline_s)
            except errors.TfscacheError as e:
                log.warning(
                    "node %s: unloading model %s after its abandoned load: %s",
                    self.target,
                    name,
                    e.message,
                )
            else:
                log.info(
                    "node %s: the abandoned load of model %s ended; it is unloaded",
                    self.target,
                    name,
                )
        finally:
            rpc.cancel()
