"""The Triton node adapter: the cache's wanted set as per-model repository loads and unloads.

Triton (``--model-control-mode=explicit``) is told what to serve one model at a time:
RepositoryModelLoad / RepositoryModelUnload by name, RepositoryIndex for what it holds
(triton-behavior.md §2). A key is ``(name, version)``: the version Triton serves under the
model's version policy (default ``latest``: the highest version on disk, which is what
the cache asks for). Triton loads and unloads whole models, not versions. The hazards
of §9 are defused here where the adapter is the right place, so the reloader need not
know them:

* §9.1 an unload returns before the model is gone: ``unload`` polls the index until each
  version is UNAVAILABLE (reason "unloaded") or absent, so a victim counts against the
  caps until its stub process has exited;
* §9.2 a load has no server-side timeout: each load carries the cache's deadline; a load
  that passes it is reported DEADLINE_EXCEEDED, and since Triton cannot cancel it, a
  background task keeps the model's turn until the load ends on the node, then unloads
  it (a failed key must not stay on the node); the model is suspect meanwhile: a new
  load of it waits for that task within its own deadline;
* §9.3 stuck UNLOADING (a stub that never exits): ``unload`` raises DEADLINE_EXCEEDED
  after its deadline, so the cache turns unhealthy and recovers the node;
* §9.5 one failed model poisons strict readiness: the adapter never reads /ready; a
  version's state comes from the index, the node's health from the channel;
* §9.6 a "successful" load is no READY guarantee under races, and §9.8 an unload then a
  load of the same name runs two instances: loads and unloads are serialized per model
  (one lock per name, held until the unload is confirmed), and every load is confirmed
  in the index (READY for that version);
* §9.7 the adapter never sends a config override (they are sticky) or a file override
  (invisible in the index);
* §9.10 a load of a name not in the node's repository is INTERNAL "failed to poll from
  model repository": it becomes NOT_FOUND only when the index does not list the name.

Not here: §9.4 (a dead stub answers 500 "Stub process ... is not healthy": the router's
business), §9.9 (ensembles couple entries: keep them out of the cache), §9.11 (404 vs 503
for a version: the router normalizes), §9.12 (start-up flags: the launcher).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence


from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.triton.client import LOADING, READY, UNLOADING, OipClient
from tfscache.repository.local import ModelRepository, not_found

log = logging.getLogger("tfscache.cache")

_FIRST_POLL_S = 0.01
_MAX_POLL_S = 0.1
_ABANDONED_POLL_S = 0.5  # a load past its deadline may run for minutes: poll it gently
_PRESENT = (READY, LOADING, UNLOADING)  # a version still holding (or about to hold) memory


class ModelTurns:
    """One asyncio.Lock per model name (Triton serializes per model too, but lets an unload
    queued behind a load undo it, §2.5); a lock is dropped once nobody holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    async def acquire(self, name: str, timeout: float) -> None:
        """Take ``name``'s turn within ``timeout`` s; TimeoutError if it did not come."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._users[name] = self._users.get(name, 0) + 1
        try:
            async with asyncio.timeout(timeout):
                await lock.acquire()
        except BaseException:
            self._drop(name)
            raise

    def release(self, name: str) -> None:
        self._locks[name].release()
        self._drop(name)

    def _drop(self, name: str) -> None:
        self._users[name] -= 1
        if not self._users[name]:
            del self._users[name], self._locks[name]


class TritonAdapter:
    """One Triton node behind its gRPC repository API (``tfscache.kinds.triton.client.OipClient``)."""

    sizes_on_disk = False  # whether a model's size on disk predicts its memory (cache.adapter)
    loads_apart = True  # each model loads by its own call: a batch's loads end apart (cache.adapter)
    lost_texts = ("Request for unknown model:",)  # a model it has not loaded since it started (cache.adapter)

    def __init__(self, client: OipClient, repository: ModelRepository, *, rpc_deadline_s: float = 10.0,
                 memory: NodeMemory | None = None) -> None:
        self.client = client
        self.target = client.target
        self.repository = repository
        self.rpc_deadline_s = rpc_deadline_s
        self._memory = memory or NodeMemory(None)
        self._turns = ModelTurns()
        self._abandoned: dict[str, asyncio.Task] = {}

    async def wait_ready(self, timeout: float) -> bool:
        return await self.client.wait_ready(timeout)

    async def sync(self, wanted: Sequence[Key], deadline_s: float) -> None:
        """Unload every model none of whose READY versions is wanted (waiting until gone), then
        load the wanted names not READY; a load that fails is logged (``available`` tells)."""
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
        results = await self.load(missing, wanted, _left(deadline))
        for (name, version), error in results.items():
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
        results: dict[Key, Exception | None] = {key: not_found(*key) for key in gone}
        keys = [k for k in keys if k not in gone]
        outcomes = await asyncio.gather(*(self._load_one(k, wanted, deadline, deadline_s) for k in keys),
                                        return_exceptions=True)
        results.update(zip(keys, outcomes))
        return results

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        names = sorted({name for name, _ in keys})
        held: list[str] = []
        try:
            for name in names:  # in name order: two batches never wait on each other
                await self._turn(name, deadline, deadline_s)
                held.append(name)
            ready = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
            staying = {(e.name, e.version) for e in ready} & {(n, str(v)) for n, v in wanted}
            # An unload drops every version of a name: one still wanted and READY keeps it, and
            # Triton's version policy releases the old version (it did, when the new one loaded).
            await asyncio.gather(*(self.client.unload(name, deadline_s=self._rpc_left(deadline))
                                   for name in names if not any(n == name for n, _ in staying)))
            await self._await_gone(keys, deadline, deadline_s)
        finally:
            for name in held:
                self._turns.release(name)

    async def available(self, key: Key, deadline_s: float) -> bool:
        name, version = key
        ready = await self.client.index(ready=True, deadline_s=deadline_s)
        return any(e.name == name and e.version == str(version) for e in ready)

    @property
    def node_pid(self) -> int | None:
        """The tritonserver process measured (found again when it was replaced), if known."""
        return self._memory.pid

    def memory(self) -> int | None:
        """RSS of tritonserver plus its children: each Python-backend model instance is a stub process (§7)."""
        return self._memory.rss(children=True)  # finds a replaced server again

    def restarted(self) -> bool:
        return self._memory.replaced()

    async def close(self) -> None:
        """Stop watching loads that passed their deadline (the node keeps whatever they load)."""
        tasks = list(self._abandoned.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _load_one(self, key: Key, wanted: Sequence[Key], deadline: float, within: float) -> None:
        """Load ``key``'s model in its turn and confirm the version READY; raises the key's error."""
        name, version = key
        await self._turn(name, deadline, within)
        handed_over = False
        try:
            try:
                await self.client.load(name, deadline_s=_left(deadline))
            except errors.DeadlineExceeded:
                handed_over = self._abandon(name)
                raise errors.DeadlineExceeded(
                    f"model {name} version {version} did not load on node {self.target} within {within} s; "
                    f"Triton cannot cancel a load: it is unloaded once it ends") from None
            except errors.Internal as e:
                raise await self._not_in_repository(name, version, e) from e
            await self._confirm(key, wanted, deadline)
        finally:
            if not handed_over:
                self._turns.release(name)

    async def _confirm(self, key: Key, wanted: Sequence[Key], deadline: float) -> None:
        """The load returned OK: is ``key``'s version READY? If Triton serves other versions of the
        name instead (its version policy) and none is wanted, the name is unloaded again."""
        name, version = key
        ready = [e.version for e in await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
                 if e.name == name]
        if str(version) in ready:
            return
        if ready:
            if not any(n == name and str(v) in ready for n, v in wanted):
                await self.client.unload(name, deadline_s=self._rpc_left(deadline))
                await self._await_gone([(name, int(v)) for v in ready if v.isdigit()], deadline, _left(deadline))
            raise errors.FailedPrecondition(
                f"model {name} version {version} is not served by node {self.target}: Triton's version "
                f"policy for {name} serves version {', '.join(sorted(ready))}")
        entry = next((e for e in await self.client.index(deadline_s=self._rpc_left(deadline))
                      if e.name == name and e.version == str(version)), None)
        state = f"{entry.state} {entry.reason}".strip() if entry is not None else "absent"
        raise errors.Aborted(f"node {self.target} loaded model {name}, but version {version} is {state} "
                             f"in its index (an unload raced the load?)")

    async def _not_in_repository(self, name: str, version: int, error: errors.Internal) -> errors.TfscacheError:
        """§9.10: INTERNAL "failed to poll from model repository" means "no such model" only when the
        index does not list the name (an unparsable config.pbtxt gives the same text)."""
        try:
            listed = any(e.name == name for e in await self.client.index(deadline_s=self.rpc_deadline_s))
        except errors.TfscacheError:
            return error
        if listed:
            return error
        return errors.ModelNotFound(f"{error.message} (model {name} version {version} is not in the "
                                    f"repository of node {self.target})")

    def _abandon(self, name: str) -> bool:
        """Hand ``name``'s turn to a task that unloads it once its load ends on the node (§9.2)."""
        log.warning("node %s: the load of model %s passed its deadline; Triton cannot cancel it, so it is "
                    "unloaded once it ends (a load that never ends needs a node restart)", self.target, name)
        task = asyncio.create_task(self._unload_when_loaded(name), name=f"tfscache-triton-abandon-{name}")
        self._abandoned[name] = task
        return True

    async def _unload_when_loaded(self, name: str) -> None:
        try:
            delay = _FIRST_POLL_S
            while True:
                try:
                    states = {e.version: e.state for e in await self.client.index() if e.name == name}
                    if LOADING not in states.values():
                        if READY in states.values():
                            await self.client.unload(name)
                        if not any(state in _PRESENT for state in states.values()):
                            break
                except errors.TfscacheError as e:
                    log.debug("node %s: watching the abandoned load of %s: %s", self.target, name, e.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _ABANDONED_POLL_S)
            log.info("node %s: the abandoned load of model %s ended; it is unloaded", self.target, name)
        finally:
            self._abandoned.pop(name, None)
            self._turns.release(name)

    async def _turn(self, name: str, deadline: float, within: float) -> None:
        try:
            await self._turns.acquire(name, deadline - time.monotonic())
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"model {name}: an earlier load or unload of it on node {self.target} did not end within "
                f"{within} s" + (" (a load that passed its deadline)" if name in self._abandoned else "")) from None

    async def _await_gone(self, keys: Iterable[Key], deadline: float, within: float) -> None:
        """Poll the index until no key is READY, LOADING or UNLOADING (UNAVAILABLE or absent: its memory is free)."""
        wanted_gone = {(name, str(version)) for name, version in keys}
        delay = _FIRST_POLL_S
        while True:
            index = await self.client.index(deadline_s=self._rpc_left(deadline))
            present = {(e.name, e.version): e.state for e in index
                       if (e.name, e.version) in wanted_gone and e.state in _PRESENT}
            if not present:
                return
            if time.monotonic() + delay > deadline:
                shown = ", ".join(f"{n} version {v} is {s}" for (n, v), s in sorted(present.items()))
                raise errors.DeadlineExceeded(f"unloading on node {self.target}: {shown} after {within} s "
                                              f"(Triton unloads asynchronously; a stub that never exits stays "
                                              f"UNLOADING)")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_POLL_S)

    def _rpc_left(self, deadline: float) -> float:
        return min(self.rpc_deadline_s, _left(deadline))


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; a millisecond at least, so a late call fails by its own deadline."""
    return max(0.001, deadline - time.monotonic())

