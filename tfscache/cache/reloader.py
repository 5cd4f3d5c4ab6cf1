"""The reloader of one node's cache: the only code that talks to the node, through its adapter.

One task per node runs ``Reloader.run``. It waits for the node and re-adopts what the
state file says it serves (``startup``), then repeats a step: ask the planner
(``tfscache.cache.planner.plan``) what to do, unload the victims, load the admitted
batch, and record what the node did in the ledger. Models that arrived while a load was
in flight share the next batch. When the node fails (unreachable, a deadline passed), the
cache turns unhealthy, every waiter gets UNAVAILABLE, and ``recover`` brings it back
(``tfscache.cache.recovery``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from tfscache import errors, logs
from tfscache.cache.adapter import NodeAdapter
from tfscache.cache.freeing import Freeing
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Entry, Key, Ledger
from tfscache.cache.measure import measure
from tfscache.cache.planner import (
    Caps,
    plan,
    plan_prefetch,
    room_message,
    share_growth,
    waits_for_freed_memory,
)
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.recovery import LostPins, names, recover, resync, startup
from tfscache.cache.signals import Signals, fail
from tfscache.cache.state import CacheState, SavedVersion
from tfscache.repository.local import ModelRepository, not_found

log = logging.getLogger("tfscache.cache")

FREE_POLL_S = 0.2  # how often memory being freed is measured again (cache/freeing.py)


class Reloader:
    """Carries out the planner's decisions against one node."""

    def __init__(self, adapter: NodeAdapter, ledger: Ledger, policy: EvictionPolicy, caps: Caps,
                 repository: ModelRepository, signals: Signals, settings, events, gpu=None, prefetch=None) -> None:
        self.adapter = adapter
        self.node = adapter.target
        self.ledger = ledger
        self.policy = policy
        self.caps = caps
        self.repository = repository
        self.signals = signals
        self.settings = settings
        self.events = events
        self.gpu = gpu  # tfscache.kinds.gpumem.NodeGpuMemory when a GPU cap is in force: sizes learned per load
        self.lost_pins = LostPins()
        self.prefetched = prefetch  # cache.prefetch.PrefetchCounts when prefetch is on (docs/prefetch.md)

    def memory_now(self) -> tuple[int | None, int | None]:
        """In a worker thread: the node's host memory and (with a GPU cap) its GPU memory now."""
        return self.adapter.memory(), (self.gpu.used() if self.gpu is not None else None)

    def wanted(self, *, loading: bool = True) -> list[Key]:
        """What the node should serve: every entry not leaving (nor ``loading`` ones if False)."""
        return [k for k, e in self.ledger.entries.items() if e.state == READY or (loading and e.state == LOADING)]

    async def step(self) -> None:
        """Plan once, then unload the victims and load the admitted batch."""
        sig, ledger = self.signals, self.ledger
        if sig.config_stale and not await self.send(self.settings.reload_deadline_s, "re-adopting"):
            return
        sig.config_sent()
        if sig.recheck_asked and not await resync(self):
            return
        if ledger.freeing():
            await self.check_freed()
        keys = [k for k, e in ledger.entries.items() if e.state != UNLOADING]
        gone, replaced = await asyncio.to_thread(self.look, keys)  # one trip off the loop for both
        if replaced:
            log.warning("node %s: its process was replaced; checking what it still serves", self.node)
            if not await resync(self):
                return
        ledger.drop_abandoned()
        now = time.monotonic()
        leaving = self.drop_vanished(gone) + self.take_evictions()
        decided = plan(ledger, self.caps, self.policy, now)
        sig.set_over_cap(decided.over_cap)  # the next release wakes the reloader
        for key in decided.blocked:
            ledger.blocked(key, now)
        batch = [self.admit(key) for key in decided.admit]
        for key in decided.victims:  # no await since the plan: no lease was taken on them meanwhile
            self.evicted(key, "capacity")
            ledger.retire(key)
        self.expire_room_waits(now)
        leaving += decided.victims
        if self.prefetched is not None and not decided.blocked and (  # beside this batch where the node
                self.adapter.loads_apart or not (batch or leaving)):  # loads apart, else with nothing else to do
            more, prefetches = self.prefetch(now, victims=not (batch and self.holds_freed_memory()))
            leaving, batch = leaving + more, batch + prefetches
        if leaving and not await self.unload(leaving):
            return
        if batch:
            await self.await_freed()
            await self.load(batch)
        if leaving or batch:
            sig.wake()  # progress was made: whatever still waits may fit now
        if sig.draining and not ledger.entries and not ledger.pending:
            sig.drained()

    def admit(self, key: Key) -> Entry:
        pending = self.ledger.pending[key]
        if pending.blocked_since is not None:
            self.events.room_waited(key, time.monotonic() - pending.blocked_since)
        return self.ledger.admitted(key, time.time())

    def prefetch(self, now: float, *, victims: bool) -> tuple[list[Key], list[Entry]]:
        """(victims, batch) of the prefetches with idle room (planner.plan_prefetch), beside this
        step's real loads (``victims`` False: free room only, for a batch that would otherwise wait
        for their memory to be measured free); stale ones (all, draining) dropped first."""
        self.ledger.drop_prefetches(float("inf") if self.signals.draining else now - self.settings.prefetch_window_s)
        leaving, batch = [], []
        while (planned := plan_prefetch(self.ledger, self.caps, self.policy, now, victims=victims)) is not None:
            key, taken = planned
            for victim in taken:
                self.evicted(victim, "prefetch")
                self.ledger.retire(victim)
            self.prefetched.count("started")
            leaving += taken
            batch.append(self.admit(key))
        return leaving, batch

    def evicted(self, key: Key, reason: str) -> None:
        """The one log line and event of an eviction (the unload's line follows once the node confirms)."""
        entry = self.ledger.entries[key]
        if entry.prefetched:  # prefetched, never requested: wasted
            self.prefetched.count("wasted")
        idle_s = max(0.0, time.time() - entry.last_use)
        log.info("node %s: evicting %s version %s (%s; %d bytes, idle %.1f s)", self.node, key[0], key[1],
                 reason, entry.bytes, idle_s, extra={"model": key[0], "version": key[1], "node": self.node,
                                                     "reason": reason, "bytes": entry.bytes,
                                                     "idle_s": round(idle_s, 3)})
        self.events.evicted(key, reason, entry.bytes)

    def expire_room_waits(self, now: float) -> None:
        timeout = self.settings.room_timeout_s
        for key, pending in list(self.ledger.pending.items()):
            if pending.blocked_since is not None and now - pending.blocked_since >= timeout:
                self.ledger.gave_up(key)
                message = room_message(self.ledger, self.caps, pending, self.node, timeout)
                log.warning("%s", message)
                self.events.room_waited(key, now - pending.blocked_since)
                fail(pending.waiters, errors.CapacityExhausted(message))

    def next_room_deadline(self) -> float | None:
        """Seconds until the reloader must look again unwoken: a room wait ends, or memory being
        freed is to be measured again (every ``FREE_POLL_S``)."""
        blocked = [p.blocked_since for p in self.ledger.pending.values() if p.blocked_since is not None]
        wait = None if not blocked else max(0.0, min(blocked) + self.settings.room_timeout_s - time.monotonic())
        if self.ledger.freeing():
            wait = FREE_POLL_S if wait is None else min(wait, FREE_POLL_S)
        return wait

    def holds_freed_memory(self) -> bool:
        """Whether unloaded bytes count until measured free: a memory or GPU cap is in force."""
        return bool(self.caps.memory_bytes or self.caps.gpu_bytes)

    async def await_freed(self) -> None:
        """Before a batch admitted on the room of versions just unloaded: while the node is over a
        cap counting what it has not given back, measure again (bounded by ``free_wait_s``)."""
        while waits_for_freed_memory(self.ledger, self.caps):
            await asyncio.sleep(FREE_POLL_S)  # the node's memory is polled; nothing wakes us for it
            await self.check_freed()

    async def check_freed(self) -> None:
        """Measure the node (in a worker thread) and release what it has given back (cache/freeing.py)."""
        host, gpu = await asyncio.to_thread(self.memory_now)
        measured, expired = self.ledger.freed(host, gpu, time.monotonic())
        for record in measured:
            log.info("node %s: memory of %s measured free (%d bytes)", self.node, names(list(record.keys)),
                     record.bytes)
        for record in expired:
            log.warning("node %s: memory of %s (%d bytes) not measured free within cache.free_wait_s = %s s; "
                        "counting it free", self.node, names(list(record.keys)), record.bytes,
                        self.settings.free_wait_s)
        if measured or expired:
            self.signals.wake()  # a load may have waited for that room

    def take_evictions(self) -> list[Key]:
        """Versions ``evict`` marked UNLOADING, and while draining every idle one (pinned or not)."""
        sig, entries = self.signals, self.ledger.entries
        keys = sig.take_evictions()
        if sig.draining:
            for key, entry in list(entries.items()):
                if entry.state == READY and entry.leases == 0:
                    self.ledger.retire(key)
                    keys.append(key)
            if keys:
                log.info("node %s draining: unloading %s", self.node, names(keys))
        keys = [k for k in keys if k in entries]
        for key in keys:
            self.evicted(key, "drain" if sig.draining else "admin")
        return keys

    def look(self, keys: list[Key]) -> tuple[list[Key], bool]:
        """In a worker thread: which of ``keys`` vanished from the repository (a stat each), and
        whether the node's process was replaced."""
        return self.repository.vanished(keys), self.adapter.restarted()

    def drop_vanished(self, gone_on_disk: list[Key]) -> list[Key]:
        """Entries whose version directory is gone: they leave the node, their waiters get NOT_FOUND."""
        gone = [k for k in gone_on_disk if k in self.ledger.entries and self.ledger.entries[k].state != UNLOADING]
        for key in gone:
            log.warning("model %s version %s vanished from the repository; removing it from node %s",
                        key[0], key[1], self.node)
            self.evicted(key, "vanished")
            fail(self.ledger.retire(key), not_found(*key))
        return gone

    async def unload(self, leaving: list[Key]) -> bool:
        """The node without ``leaving``; returns once it reports each gone (the batch waits for that).
        Under a memory or GPU cap their bytes keep counting until measured free (cache/freeing.py)."""
        started, sizes = time.monotonic(), {k: self.ledger.entries[k].bytes for k in leaving}
        gpu = sum(self.ledger.entries[k].gpu for k in leaving)
        before = await asyncio.to_thread(self.memory_now) if self.holds_freed_memory() else None
        done = False
        try:
            await self.adapter.unload(leaving, self.wanted(loading=False), self.settings.reload_deadline_s)
            done = True
        except errors.TfscacheError as e:
            self.mark_unhealthy(f"unloading {names(leaving)}: {e.grpc_code.name}: {e.message}")
            return False
        finally:
            for key in leaving:
                self.ledger.unloaded(key)
                self.signals.unloaded(key)
            if done and before is not None:  # each cap in force waits for its own memory
                host = sum(sizes.values()) if self.caps.memory_bytes else 0
                self.ledger.free_later(Freeing(tuple(leaving), host, gpu if self.caps.gpu_bytes else 0, *before,
                                               until=time.monotonic() + self.settings.free_wait_s))
            self.signals.services.save()
        if before is not None:
            await self.check_freed()
        seconds = time.monotonic() - started
        for key in leaving:
            log.info("node %s: unloaded %s version %s in %.3f s (%d bytes)", self.node, key[0], key[1],
                     seconds, sizes[key], extra={"model": key[0], "version": key[1], "node": self.node,
                                                 "duration_s": round(seconds, 6), "bytes": sizes[key]})
            self.events.unloaded(key, seconds, sizes[key])
        return True

    async def load(self, batch: list[Entry]) -> None:
        if not self.repository.local:  # a bucket: each version into the disk tier first
            batch = await self.fetch(batch)
            if not batch:
                return
        rss_before, gpu_before = await asyncio.to_thread(self.memory_now)
        started = time.monotonic()
        real = [e for e in batch if not e.prefetched]  # prefetches beside real loads load apart, each
        parts = [real] + [[e] for e in batch if e.prefetched] if real else [batch]  # answered as it ends
        outcomes = await asyncio.gather(*(self.load_part(part, started, len(parts) > 1) for part in parts))
        load_s = time.monotonic() - started
        if None in outcomes:
            return
        loaded = [e for part, results in zip(parts, outcomes) for e in part if results.get(e.key) is None]
        rss_after, gpu_after = await asyncio.to_thread(self.memory_now)
        measure(loaded, rss_before, rss_after, self.caps, self.ledger)
        for key, size in share_growth({e.key: e.bytes for e in loaded}, gpu_before, gpu_after).items():
            self.ledger.learn_gpu(key, size)
        if len(parts) == 1:  # settled once measured: its log lines carry the bytes
            self.settle(batch, outcomes[0], load_s)
        self.signals.services.save()

    async def load_part(self, part: list[Entry], started: float, apart: bool) -> dict | None:
        """The adapter's results for ``part``, settled at once when ``apart`` (beside other parts);
        None when the node failed (it is then unhealthy)."""
        keys = [e.key for e in part]
        try:
            results = await self.adapter.load(keys, self.wanted(), self.settings.reload_deadline_s)
        except errors.TfscacheError as e:
            if self.signals.healthy:
                self.mark_unhealthy(f"reload loading {names(keys)}: {e.message}")
            return None
        if not self.signals.healthy:  # another part found the node failed: it recovers everything
            return None
        if apart:
            self.settle(part, results, time.monotonic() - started)
        return results

    def settle(self, part: list[Entry], results: dict, load_s: float) -> None:
        """Record what the node did with ``part`` (``results``: the adapter's) and answer its waiters."""
        now = time.monotonic()
        for entry in part:
            if results.get(entry.key) is None:
                self.loaded(entry, load_s, now)
        failed = [(e, results[e.key]) for e in part if results.get(e.key) is not None]
        for entry, error in failed:
            self.load_failed(entry, error, load_s, now)
        if any(isinstance(error, errors.Unavailable) for _, error in failed):
            self.mark_unhealthy(f"checking status of {names([e.key for e in part])}: node unavailable")

    async def fetch(self, batch: list[Entry]) -> list[Entry]:
        """Download the batch's versions (tfscache.storage); the ones that failed fail their requests
        with the store's error, without the failure backoff: the next request tries again."""
        started = time.monotonic()
        results = await asyncio.gather(*(asyncio.wait_for(self.repository.prepare(*e.key),
                                                          self.settings.reload_deadline_s) for e in batch),
                                       return_exceptions=True)
        now = time.monotonic()
        for entry, error in zip(batch, results):
            if isinstance(error, TimeoutError):
                error = errors.DeadlineExceeded(f"downloading model {entry.key[0]} version {entry.key[1]} took "
                                                f"longer than cache.reload_deadline_s = {self.settings.reload_deadline_s} s")
            if isinstance(error, BaseException):
                self.load_failed(entry, error, now - started, now, backoff=False)
        return [e for e, error in zip(batch, results) if not isinstance(error, BaseException)]

    def loaded(self, entry: Entry, load_s: float, now: float) -> None:
        if entry.prefetched:
            self.prefetched.count("completed")
        waiters = self.ledger.loaded(entry.key, load_s, now)
        log.info("node %s: loaded %s version %s in %.3f s (%d bytes%s)", self.node, entry.key[0], entry.key[1],
                 load_s, entry.bytes, "" if entry.measured else ", estimated",
                 extra={"model": entry.key[0], "version": entry.key[1], "node": self.node,
                        "duration_s": round(load_s, 6), "bytes": entry.bytes, "measured": entry.measured})
        self.events.loaded(entry.key, load_s, entry.bytes, entry.measured)
        for fut in waiters:
            if not fut.done():
                fut.set_result(self.signals.services.lease(entry))

    def load_failed(self, entry: Entry, error: BaseException, load_s: float, now: float, *,
                    backoff: bool = True) -> None:
        if not isinstance(error, errors.TfscacheError):
            error = errors.Internal(f"checking load of {entry.key[0]}: {error!r}")
        log.warning("node %s: loading %s version %s failed after %.3f s: %s: %s", self.node, entry.key[0],
                    entry.key[1], load_s, error.grpc_code.name, error.message,
                    extra={"model": entry.key[0], "version": entry.key[1], "node": self.node,
                           "duration_s": round(load_s, 6), "bytes": entry.bytes})
        self.events.load_failed(entry.key, load_s, error)
        if entry.prefetched:  # counted apart, and no backoff: the next request loads it again
            self.prefetched.count("failed")
        until = now + self.settings.failure_backoff_s if backoff and not entry.prefetched else None
        fail(self.ledger.failed(entry.key, error, until), error)

    async def send(self, deadline_s: float, why: str, *, loading: bool = True) -> bool:
        """Send what the node should serve; False (and the node unhealthy) if that fails."""
        try:
            await self.adapter.sync(self.wanted(loading=loading), deadline_s)
            return True
        except errors.TfscacheError as e:
            self.mark_unhealthy(f"reload {why}: {e.grpc_code.name}: {e.message}")
            return False

    def lost(self, key: Key) -> None:
        """The node lost ``key`` (it restarted): the one path for it, whether ``recover`` or
        ``resync`` found it. The entry leaves (``Ledger.lost``); a pinned one keeps its pin and is
        loaded and pinned again once the node is healthy (``LostPins``). The node may still hold
        the version in some state (TF Serving keeps a failed one sticky), so the next step sends
        it the wanted set without it first, and a load of it starts afresh."""
        self.evicted(key, "node_lost")
        self.signals.mark_config_stale()
        entry = self.ledger.lost(key)
        if key in self.ledger.pinned and entry is not None:
            self.lost_pins.add(SavedVersion(key[0], key[1], entry.bytes, entry.measured, entry.last_use, True))

    def mark_unhealthy(self, reason: str) -> None:
        log.error("node %s is unhealthy: %s", self.node, reason)
        self.signals.set_health(False, reason)
        self.signals.fail_all(self.ledger, errors.NodeUnavailable(f"node {self.node} is unhealthy: {reason}"))

    async def run(self, state: CacheState) -> None:
        logs.bind(node=self.node)  # this task's log lines name the node
        await startup(self, state)
        failures = 0
        sig = self.signals
        while True:
            if not sig.healthy:
                failures = 0 if await recover(self, failures) else failures + 1
                continue
            await sig.wait_for_work(self.next_room_deadline())
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug here must not leave callers hanging
                log.exception("cache step for node %s failed", self.node)
                self.mark_unhealthy(f"internal error: {e!r}")
