"""The Triton node adapter: the cache's wanted set as per-model repository loads and unloads.

Triton (``--model-control-mode=explicit``) is told what to serve one model at a time:
RepositoryModelLoad / RepositoryModelUnload by name, RepositoryIndex for what it holds
(docs/upstream/triton.md, "Repository API"). A key is ``(name, version)``: the version Triton
serves under the model's version policy (default ``latest``: the highest version on disk, which is
what the cache asks for). Triton loads and unloads whole models, not versions. What both OIP kinds
share (turns per name, deadlines, abandoned loads) is ``tfscache.kinds.oip.adapter.OipAdapter``.
The hazards of docs/upstream/triton.md, "Hazards a caching manager must defuse", are defused here
where the adapter is the right place, so the reloader need not know them:

* an unload returns before the model is gone: ``unload`` polls the index until each version is
  UNAVAILABLE (reason "unloaded") or absent, so a victim counts against the caps until its stub
  process has exited;
* a load has no server-side timeout: each load carries the cache's deadline; a load that passes
  it is reported DEADLINE_EXCEEDED, and since Triton cannot cancel it, a background task keeps
  the model's turn until the load ends on the node, then unloads it (a failed key must not stay
  on the node); the model is suspect meanwhile: a new load of it waits for that task within its
  own deadline;
* stuck UNLOADING (a stub that never exits): ``unload`` raises DEADLINE_EXCEEDED after its
  deadline, so the cache turns unhealthy and recovers the node;
* one failed model poisons strict readiness: the adapter never reads /ready; a version's state
  comes from the index, the node's health from the channel;
* a "successful" load is no READY guarantee under races, and an unload then a load of the same
  name runs two instances: loads and unloads are serialized per model (one turn per name, held
  until the unload is confirmed), and every load is confirmed in the index (READY for that
  version);
* the adapter never sends a file override (invisible in the index), and a config override
  (they are sticky) only to move a model between the GPU and host tiers, with demotion on
  (``enable_demotion``; tfscache.kinds.triton.tiers): promotion sends the model's own
  configuration back, and an unload ends any override;
* a load of a name not in the node's repository is INTERNAL "failed to poll from model
  repository": it becomes NOT_FOUND only when the index does not list the name.

Not here: a dead stub answering 500 "Stub process ... is not healthy" (the router's business),
ensembles coupling entries (keep them out of the cache), 404 vs 503 for a version (the router
normalizes), start-up flags (the launcher).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.cache.tiers import HOST
from tfscache.kinds.oip.adapter import OipAdapter, left
from tfscache.kinds.triton.client import LOADING, READY, UNLOADING, OipClient
from tfscache.kinds.triton.tiers import InPlaceTiers
from tfscache.repository.local import not_found

log = logging.getLogger("tfscache.cache")

_FIRST_POLL_S = 0.01
_MAX_POLL_S = 0.1
_ABANDONED_POLL_S = 0.5  # a load past its deadline may run for minutes: poll it gently
_PRESENT = (READY, LOADING, UNLOADING)  # a version still holding (or about to hold) memory


class TritonAdapter(OipAdapter):
    """One Triton node behind its gRPC repository API (``tfscache.kinds.triton.client.OipClient``)."""

    client: OipClient
    # A model it has not loaded since it started (cache.adapter).
    lost_texts = ("Request for unknown model:",)
    product = "Triton"
    log = log
    _tiers: InPlaceTiers | None = None

    def enable_demotion(self, rest_address: str, cpu_instances: int) -> None:
        """Move models between the GPU and CPU instances in place (cache.demote = host); the node's
        HTTP port (``rest_address``) answers their own configurations."""
        self._tiers = InPlaceTiers(self.target, rest_address, cpu_instances)
        self.demotes_in_place = True

    def can_demote(self, key: Key) -> bool:
        return self._tiers is not None and self._tiers.can_demote(key[0])

    async def move(self, key: Key, tier: str, deadline_s: float) -> None:
        """Load ``key``'s model again with a config override that changes only its instance groups:
        to ``KIND_CPU`` instances (``tier`` HOST) or back to its own; returns once the load
        answered and the version is READY. Triton updates the model in place, serving throughout."""
        if self._tiers is None:
            raise errors.FailedPrecondition(f"node {self.target} does not demote models")
        name, version = key
        deadline = time.monotonic() + deadline_s
        async with self._turns_of([name], deadline, deadline_s):
            config = self._tiers.override(name, tier == HOST)
            await self.client.load(name, deadline_s=left(deadline), config=config)
            ready = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
            if not any(e.name == name and e.version == str(version) for e in ready):
                raise errors.Aborted(f"node {self.target} moved model {name}, but version "
                                     f"{version} is not READY in its index")

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        names = sorted({name for name, _ in keys})
        async with self._turns_of(names, deadline, deadline_s):
            ready = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
            staying = {(e.name, e.version) for e in ready} & {(n, str(v)) for n, v in wanted}
            # An unload drops every version of a name: one still wanted and READY keeps it, and
            # Triton's version policy releases the old version (it did, when the new one loaded).
            await asyncio.gather(*(self.client.unload(name, deadline_s=self._rpc_left(deadline))
                                   for name in names if not any(n == name for n, _ in staying)))
            await self._await_gone(keys, deadline, deadline_s)
            if self._tiers is not None:
                for name in names:
                    if not any(n == name for n, _ in staying):
                        self._tiers.forget(name)

    async def available(self, key: Key, deadline_s: float) -> bool:
        name, version = key
        ready = await self.client.index(ready=True, deadline_s=deadline_s)
        return any(e.name == name and e.version == str(version) for e in ready)

    async def _load_in_turn(self, key: Key, wanted: Sequence[Key], deadline: float,
                            within: float, handed_over: list[bool]) -> None:
        """Send the load and confirm the version READY; raises the key's error."""
        name, version = key
        try:
            await self.client.load(name, deadline_s=left(deadline))
        except errors.DeadlineExceeded:
            handed_over[0] = self._abandon(name, self._unload_when_loaded(name))
            raise self._late(name, version, within) from None
        except errors.Internal as e:
            raise await self._not_in_repository(name, version, e) from e
        await self._confirm(key, wanted, deadline)
        if self._tiers is not None:  # a plain load: what Triton serves now is the own configuration
            await self._tiers.learn(name, self._rpc_left(deadline))

    async def _confirm(self, key: Key, wanted: Sequence[Key], deadline: float) -> None:
        """The load returned OK: is ``key``'s version READY? If Triton serves other versions of the
        name instead (its version policy) and none is wanted, the name is unloaded again."""
        name, version = key
        index = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
        ready = [e.version for e in index if e.name == name]
        if str(version) in ready:
            return
        if ready:
            if not any(n == name and str(v) in ready for n, v in wanted):
                await self.client.unload(name, deadline_s=self._rpc_left(deadline))
                versions = [(name, int(v)) for v in ready if v.isdigit()]
                await self._await_gone(versions, deadline, left(deadline))
            raise errors.FailedPrecondition(
                f"model {name} version {version} is not served by node {self.target}: Triton's version "
                f"policy for {name} serves version {', '.join(sorted(ready))}"
            )
        entry = next((e for e in await self.client.index(deadline_s=self._rpc_left(deadline))
                      if e.name == name and e.version == str(version)), None)
        state = f"{entry.state} {entry.reason}".strip() if entry is not None else "absent"
        raise errors.Aborted(
            f"node {self.target} loaded model {name}, but version {version} is {state} "
            f"in its index (an unload raced the load?)"
        )

    async def _not_in_repository(self, name: str, version: int,
                                 error: errors.Internal) -> errors.TfscacheError:
        """INTERNAL "failed to poll from model repository" means "no such model" only when the index
        does not list the name (an unparsable config.pbtxt gives the same text; docs/upstream/triton.md,
        "Hazards a caching manager must defuse")."""
        try:
            listed = any(
                e.name == name for e in await self.client.index(deadline_s=self.rpc_deadline_s)
            )
        except errors.TfscacheError:
            return error
        if listed:
            return error
        return errors.ModelNotFound(
            f"{error.message} (model {name} version {version} is not in the "
            f"repository of node {self.target})"
        )

    async def _unload_when_loaded(self, name: str) -> None:
        """Poll the index until the abandoned load of ``name`` ends, then unload it."""
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
                log.debug(
                    "node %s: watching the abandoned load of %s: %s", self.target, name, e.message
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _ABANDONED_POLL_S)
        log.info("node %s: the abandoned load of model %s ended; it is unloaded", self.target, name)

    async def _await_gone(self, keys: Iterable[Key], deadline: float, within: float) -> None:
        """Poll the index until no key is READY, LOADING or UNLOADING (UNAVAILABLE or absent: its
        memory is free)."""
        wanted_gone = {(name, str(version)) for name, version in keys}
        delay = _FIRST_POLL_S
        while True:
            index = await self.client.index(deadline_s=self._rpc_left(deadline))
            present = {(e.name, e.version): e.state for e in index
                       if (e.name, e.version) in wanted_gone and e.state in _PRESENT}
            if not present:
                return
            if time.monotonic() + delay > deadline:
                shown = ", ".join(
                    f"{n} version {v} is {s}" for (n, v), s in sorted(present.items())
                )
                raise errors.DeadlineExceeded(
                    f"unloading on node {self.target}: {shown} after {within} "
                    f"s (Triton unloads asynchronously; a stub that never exits "
                    f"stays UNLOADING)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_POLL_S)

    def _vanished(self, key: Key) -> errors.TfscacheError:
        return not_found(*key)
