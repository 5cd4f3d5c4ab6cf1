"""The MLServer node adapter: the cache's wanted set as per-model repository loads and unloads.

MLServer (started with ``load_models_at_startup`` false, tfscache.kinds.mlserver.launcher) is
told what to serve one model name at a time through the repository extension of its gRPC
``inference.GRPCInferenceService`` (tfscache.kinds.mlserver.client). A key is ``(name,
version)``: the version directory ``NAME/V/`` whose ``model-settings.json`` says
``parameters.version = "V"``. What MLServer does, and what the adapter makes of it
(docs/mlserver.md, "Behaviour"):

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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.kinds.mlserver.client import READY, UNKNOWN, MLServerClient
from tfscache.kinds.nodepid import NodeMemory
from tfscache.repository.local import ModelRepository

log = logging.getLogger("tfscache.kinds.mlserver.adapter")

_LOAD_RPC_S = 3600.0  # a load RPC's own deadline: long, so that gRPC never cancels a load half-way
_PRESENT = (READY, UNKNOWN)  # a version holding (or about to hold) memory


def model_not_found(name: str, version: int | None = None) -> errors.ModelNotFound:
    """MLServer's NOT_FOUND text (mlserver.errors.ModelNotFound) for a model or version."""
    if version is None:
        return errors.ModelNotFound(f"Model {name} not found")
    return errors.ModelNotFound(f"Model {name} with version {version} not found")


class MLServerAdapter:
    """One MLServer node behind its gRPC repository API (``MLServerClient``)."""

    sizes_on_disk = False  # a pickled model's memory is the runtime's and its worker's: learned at load
    loads_apart = True  # each model loads by its own call: a batch's loads end apart (cache.adapter)
    # MLServer's NOT_FOUND for a model it does not hold ("Model NAME not found", "Model NAME with
    # version V not found"): the only 404/NOT_FOUND it sends (mlserver.errors.ModelNotFound).
    lost_texts = ("Model ",)

    def __init__(self, client: MLServerClient, repository: ModelRepository, *, rpc_deadline_s: float = 10.0,
                 memory: NodeMemory | None = None) -> None:
        self.client = client
        self.target = client.target
        self.repository = repository
        self.rpc_deadline_s = rpc_deadline_s
        self._memory = memory or NodeMemory(None)
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        self._abandoned: dict[str, asyncio.Task] = {}

    async def wait_ready(self, timeout: float) -> bool:
        return await self.client.wait_ready(timeout)

    async def sync(self, wanted: Sequence[Key], deadline_s: float) -> None:
        """Unload every name none of whose READY versions is wanted, then load the wanted keys not
        READY; a load that fails is logged (``available`` tells)."""
        deadline = time.monotonic() + deadline_s
        index = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
        ready = {(e.name, int(e.version)) for e in index if e.version.isdigit()}
        want = set(wanted)
        kept = {name for name, version in ready if (name, version) in want}
        extra = sorted(key for key in ready if key[0] not in kept)
        if extra:
            await self.unload(extra, wanted, _left(deadline))
        missing = sorted(want - ready)
        if not missing:
            return
        for (name, version), error in (await self.load(missing, wanted, _left(deadline))).items():
            if error is None:
                continue
            if isinstance(error, errors.Unavailable) or not isinstance(error, errors.TfscacheError):
                raise error
            log.warning("node %s: loading %s version %s again failed: %s: %s", self.target, name, version,
                        error.grpc_code.name, error.message)

    async def load(self, keys: Sequence[Key], wanted: Sequence[Key],
                   deadline_s: float) -> dict[Key, Exception | None]:
        deadline = time.monotonic() + deadline_s
        gone = set(await asyncio.to_thread(self.repository.vanished, keys))  # its directory may have gone since
        results: dict[Key, Exception | None] = {key: model_not_found(*key) for key in gone}
        keys = [k for k in keys if k not in gone]
        outcomes = await asyncio.gather(*(self._load_one(k, deadline, deadline_s) for k in keys),
                                        return_exceptions=True)
        results.update(zip(keys, outcomes))
        return results

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        staying = {name for name, _ in wanted}
        # An unload drops every version of a name: a name with a version still wanted stays.
        names = sorted({name for name, _ in keys} - staying)
        held: list[str] = []
        try:
            for name in names:  # in name order: two batches never wait on each other
                await self._turn(name, deadline, deadline_s)
                held.append(name)
            await asyncio.gather(*(self._unload_name(name, deadline) for name in names))
            present = {e.name: e.state for e in await self.client.index(deadline_s=self._rpc_left(deadline))
                       if e.name in held and e.state in _PRESENT}
            if present:
                shown = ", ".join(f"{n} is {s}" for n, s in sorted(present.items()))
                raise errors.Aborted(f"unloading on node {self.target}: {shown} after its unload returned "
                                     f"(another client loaded it again?)")
        finally:
            for name in held:
                self._release(name)

    async def available(self, key: Key, deadline_s: float) -> bool:
        name, version = key
        return await self.client.model_ready(name, str(version), deadline_s=deadline_s)

    @property
    def node_pid(self) -> int | None:
        """The mlserver process measured (found again when it was replaced), if known."""
        return self._memory.pid

    def memory(self) -> int | None:
        """RSS of mlserver plus its children: the inference workers hold the models."""
        return self._memory.rss(children=True)

    def restarted(self) -> bool:
        return self._memory.replaced()

    async def close(self) -> None:
        """Stop watching loads that passed their deadline (the node keeps whatever they load)."""
        tasks = list(self._abandoned.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _load_one(self, key: Key, deadline: float, within: float) -> None:
        """Load ``key``'s model in its turn and confirm the version ready; raises the key's error."""
        name, version = key
        await self._turn(name, deadline, within)
        handed_over = False
        try:
            rpc = asyncio.ensure_future(self.client.load(name, deadline_s=max(_LOAD_RPC_S, within)))
            try:
                await asyncio.wait_for(asyncio.shield(rpc), _left(deadline))
            except asyncio.CancelledError:
                handed_over = self._abandon(name, rpc)  # the caller gave up; the node goes on loading
                raise
            except TimeoutError:
                handed_over = self._abandon(name, rpc)
                raise errors.DeadlineExceeded(
                    f"model {name} version {version} did not load on node {self.target} within {within} s; "
                    f"MLServer cannot cancel a load: it is unloaded once it ends") from None
            except errors.NotFound as e:
                raise errors.ModelNotFound(f"{e.message} (model {name} version {version} is not in the "
                                           f"repository of node {self.target})") from e
            except errors.Unavailable:
                raise
            except (errors.Cancelled, errors.DeadlineExceeded) as e:  # the channel closed, the node went away
                raise errors.NodeUnavailable(f"node {self.target}: the load of model {name} version {version} "
                                             f"ended {e.grpc_code.name} (the node went away?)") from e
            except errors.TfscacheError as e:
                raise type(e)(f"load failed for model '{name}' version {version} on node {self.target}: "
                              f"{e.message}") from e
            if not await self.client.model_ready(name, str(version), deadline_s=self._rpc_left(deadline)):
                raise errors.FailedPrecondition(
                    f"model {name} version {version} is not served by node {self.target} after its load: MLServer "
                    f"names versions by parameters.version in model-settings.json, which must be \"{version}\", "
                    f"the version directory's name")
        finally:
            if not handed_over:
                self._release(name)

    async def _unload_name(self, name: str, deadline: float) -> None:
        try:
            await self.client.unload(name, deadline_s=self._rpc_left(deadline))
        except errors.NotFound:
            pass  # nothing of it loaded: gone already

    def _abandon(self, name: str, rpc: asyncio.Future) -> bool:
        """Hand ``name``'s turn to a task that unloads it once its load ends on the node."""
        log.warning("node %s: the load of model %s passed its deadline; MLServer cannot cancel it, so it is "
                    "unloaded once it ends", self.target, name)
        task = asyncio.create_task(self._unload_when_loaded(name, rpc), name=f"tfscache-mlserver-abandon-{name}")
        self._abandoned[name] = task
        return True

    async def _unload_when_loaded(self, name: str, rpc: asyncio.Future) -> None:
        try:
            try:
                await rpc
            except errors.TfscacheError as e:
                log.info("node %s: the abandoned load of model %s ended: %s", self.target, name, e.message)
            try:
                await self._unload_name(name, time.monotonic() + self.rpc_deadline_s)
            except errors.TfscacheError as e:
                log.warning("node %s: unloading model %s after its abandoned load: %s", self.target, name, e.message)
            else:
                log.info("node %s: the abandoned load of model %s ended; it is unloaded", self.target, name)
        finally:
            rpc.cancel()
            self._abandoned.pop(name, None)
            self._release(name)

    async def _turn(self, name: str, deadline: float, within: float) -> None:
        """Take ``name``'s turn (its one lock) by ``deadline``; DEADLINE_EXCEEDED if it did not come."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._users[name] = self._users.get(name, 0) + 1
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await lock.acquire()
        except BaseException as e:
            self._drop(name)
            if isinstance(e, TimeoutError):
                raise errors.DeadlineExceeded(
                    f"model {name}: an earlier load or unload of it on node {self.target} did not end within "
                    f"{within} s" + (" (a load that passed its deadline)" if name in self._abandoned else "")) from None
            raise

    def _release(self, name: str) -> None:
        self._locks[name].release()
        self._drop(name)

    def _drop(self, name: str) -> None:
        self._users[name] -= 1
        if not self._users[name]:
            del self._users[name], self._locks[name]

    def _rpc_left(self, deadline: float) -> float:
        return min(self.rpc_deadline_s, _left(deadline))


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; a millisecond at least, so a late call fails by its own deadline."""
    return max(0.001, deadline - time.monotonic())
