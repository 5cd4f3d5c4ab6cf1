"""The reloader of one node's cache: the only code that talks to the node, through its adapter.

The cache manager's task for the node awaits ``Reloader.startup`` once: it waits for the node
and re-adopts what the state file says it serves. Then it awaits ``Reloader.work`` again and
again; each call takes one step: ask the planner (``tfscache.cache.planner.plan``) what to
do, unload the victims, load the admitted batch, and record what the node did in the
ledger. Models that arrived while a load was in flight share the next batch. When the node
fails (unreachable, a deadline passed), the cache turns unhealthy, every waiter gets
UNAVAILABLE, and the next ``work`` recovers it instead (``tfscache.cache.recovery``).

The reloader never calls back into the manager. Each ``startup`` and ``work`` returns the
pinned versions the node lost that are to be loaded and pinned again now (the manager does
that); the requests that waited for a load get their leases from ``Leases``
(tfscache.cache.lease), and each change is saved through the ``StateFile`` as it happens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from tfscache import errors
from tfscache.cache.across import Across
from tfscache.cache.adapter import NodeAdapter
from tfscache.cache.events import CacheEvents, Evictions
from tfscache.cache.freeing import Freeing
from tfscache.cache.lease import Leases
from tfscache.cache.ledger import READY, UNLOADING, Entry, HandOff, Key, Ledger
from tfscache.cache.measure import measure
from tfscache.cache.moves import TierMoves
from tfscache.cache.planner import (
    Caps,
    plan,
    plan_prefetch,
    grown,
    oom_message,
    room_message,
    share_growth,
    waits_for_freed_memory,
)
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.prefetch import PrefetchCounts
from tfscache.cache.recovery import Recovery, names
from tfscache.cache.signals import Signals, fail
from tfscache.cache.state import CacheState, LostPins, SavedVersion, StateFile
from tfscache.cache.tiers import GPU, HOST
from tfscache.repository.local import ModelRepository, not_found

log = logging.getLogger("tfscache.cache")

FREE_POLL_S = 0.2  # how often memory being freed is measured again (cache/freeing.py)


class Reloader:
    """Carries out the planner's decisions against one node."""

    def __init__(self, adapter: NodeAdapter, ledger: Ledger, policy: EvictionPolicy, caps: Caps,
                 repository: ModelRepository, signals: Signals, settings, events: CacheEvents, *,
                 leases: Leases, state_file: StateFile, lost_pins: LostPins, gpu=None,
                 prefetch: PrefetchCounts | None = None, moves: TierMoves | None = None,
                 before_unload: Callable[[Sequence[Key]], Awaitable[None]] | None = None,
                 across: Across | None = None) -> None:
        """``settings``: the cache section. ``leases``: where the requests that waited for a load
        get theirs; ``state_file``: saved as the node's config changes; ``lost_pins``: pinned
        versions the node lost (the recovery adds them). ``gpu``:
        tfscache.kinds.gpumem.NodeGpuMemory when a GPU cap is in force (sizes learned per load);
        ``prefetch``: the prefetch counts when prefetch is on (docs/prefetch.md); ``moves``: with
        demotion on and a node that demotes in place, what decides demotions and promotions
        (tfscache.cache.moves; docs/tiers.md); ``before_unload(keys)``: awaited before the node
        is told to unload ``keys`` (tfscache.workers revokes its delegations there);
        ``across``: with host-tier nodes, the nodes of the other tier (tfscache.cache.across):
        ``moves`` then decides hand-offs to them rather than moves in place."""
        self.adapter = adapter
        self.node = adapter.target
        self.ledger = ledger
        self.policy = policy
        self.caps = caps
        self.repository = repository
        self.signals = signals
        self.settings = settings
        self.events = events
        self.leases = leases
        self.state_file = state_file
        self.gpu = gpu
        self.prefetched = prefetch
        self.moves = moves
        self.before_unload = before_unload
        self.across = across
        self.promoting: set[asyncio.Task] = set()  # host tier: promotions handed back, running
        self.evictions = Evictions(self.node, ledger, events, prefetch)
        self.recovery = Recovery(adapter, ledger, signals, lost_pins, state_file, repository,
                                 settings, self.evictions)

    async def startup(self, state: CacheState) -> list[SavedVersion]:
        """Wait for the node to answer and re-adopt the saved models it still serves (healthy
        then); the pinned versions it lost, to load and pin again now."""
        await self.recovery.startup(state)
        return self.recovery.pins_to_restore()

    async def work(self) -> list[SavedVersion]:
        """One turn: recover the node if it is unhealthy, else wait for work and take a step.
        The pinned versions the node lost to load and pin again now: none unless this turn
        found the node healthy with its wanted set again (a recovery or a resync)."""
        sig = self.signals
        if not sig.healthy:
            await self.recovery.recover()
            return self.recovery.pins_to_restore()
        await sig.wait_for_work(self.next_room_deadline())
        try:
            await self.step()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave callers hanging
            log.exception("cache step for node %s failed", self.node)
            self.recovery.mark_unhealthy(f"internal error: {e!r}")
        return self.recovery.pins_to_restore()

    def memory_now(self) -> tuple[int | None, int | None]:
        """In a worker thread: the node's host memory and (with a GPU cap) its GPU memory now."""
        return self.adapter.memory(), (self.gpu.used() if self.gpu is not None else None)

    async def step(self) -> None:
        """Plan once, then unload the victims and load the admitted batch."""
        sig, ledger = self.signals, self.ledger
        if sig.config_stale and not await self.send(self.settings.reload_deadline_s, "re-adopting"):
            return
        sig.config_sent()
        if sig.recheck_asked and not await self.recovery.resync():
            return
        if ledger.freeing():
            await self.check_freed()
        keys = [k for k, e in ledger.entries.items() if e.state != UNLOADING]
        gone, replaced = await asyncio.to_thread(self.look, keys)  # one trip off the loop for both
        if replaced:
            log.warning("node %s: its process was replaced; checking what it still serves",
                        self.node)
            if not await self.recovery.resync():
                return
        ledger.drop_abandoned()
        now = time.monotonic()
        leaving = self.drop_vanished(gone) + self.take_evictions() + self.take_away()
        moves = self.moves
        if self.across is not None:
            decided = self.plan_across(now)
        else:
            decided = plan(ledger, self.caps, self.policy, now,
                           demotable=moves.demotable() if moves else (),
                           promote=moves.promotions() if moves else ())
        for key in decided.demote:  # no await since the plan: each is still idle
            ledger.moving_to(key, HOST)
        for key in decided.promote:
            ledger.moving_to(key, GPU)
        sig.set_over_cap(decided.over_cap)  # the next release wakes the reloader
        for key in decided.blocked:
            ledger.blocked(key, now)
        self.refuse_handoffs(decided.blocked)
        batch = [self.admit(key) for key in decided.admit]
        for key in decided.victims:  # no await since the plan: no lease was taken on them meanwhile
            self.evictions.evicted(key, "capacity")
            ledger.retire(key)
        self.expire_room_waits(now)
        leaving += decided.victims
        # Prefetches go beside this batch where the node loads apart, else with nothing else to do.
        if self.prefetched is not None and not decided.blocked and (
                self.adapter.loads_apart or not (batch or leaving)):
            more, prefetches = self.prefetch(now, victims=not (batch and self.holds_freed_memory()))
            leaving, batch = leaving + more, batch + prefetches
        if leaving and not await self.unload(leaving):
            return
        if decided.demote and not await (self.hand_off(decided.demote) if self.across
                                          else self.move(decided.demote, HOST)):
            return
        if batch:
            await self.await_freed()
            await self.load(batch)
        if decided.promote and sig.healthy:
            await self.await_freed()
            await self.move(decided.promote, GPU)
        if leaving or batch or decided.demote or decided.promote:
            sig.wake()  # progress was made: whatever still waits may fit now
        if sig.draining and not ledger.entries and not ledger.pending:
            sig.drained()

    # -- across nodes (tfscache.cache.across) ----------------------------------------------

    def plan_across(self, now: float):
        """Today's plan, its victims that may be demoted handed off to a host-tier node instead
        (GPU tier); a host-tier node's promotions that pay handed back, each in a task."""
        ledger, moves = self.ledger, self.moves
        decided = plan(ledger, self.caps, self.policy, now)
        if moves is None:
            return decided
        if ledger.tier == GPU:
            demotable = set(moves.demotable()) if decided.victims else set()
            decided.demote = [k for k in decided.victims if k in demotable]
            decided.victims = [k for k in decided.victims if k not in demotable]
        else:
            for key in moves.promotions():
                ledger.moving_to(key, GPU)
                task = asyncio.create_task(self.promote_across(key),
                                           name=f"tfscache-promote-{key[0]}-{key[1]}")
                self.promoting.add(task)
                task.add_done_callback(self.promoting.discard)
        return decided

    def refuse_handoffs(self, blocked: list[Key]) -> None:
        """A version handed over from another node that finds no room here now is refused at
        once: the node handing it over keeps it, or unloads it (it does not wait for room, which
        could wait on that node in turn)."""
        for key in blocked:
            pending = self.ledger.pending[key]
            for waiter in pending.waiters:
                if isinstance(waiter, HandOff) and not waiter.done():
                    waiter.set_exception(errors.CapacityExhausted(
                        f"node {self.node} has no room for model {key[0]} version {key[1]} now: "
                        "what it holds is in use, pinned or moving"))
            if not pending.live() and not pending.prefetch:
                self.ledger.gave_up(key)

    def take_away(self) -> list[Key]:
        """Versions another node holds now whose requests here have ended: they leave."""
        keys = self.ledger.away()
        for key in keys:
            self.ledger.retire(key)
        return keys

    async def hand_off(self, keys: list[Key]) -> bool:
        """Demote ``keys`` (recorded as moving to HOST) to host-tier nodes: each loaded there
        while it keeps answering here, then away from here, then unloaded once its requests here
        have ended (waited for, up to ``reload_deadline_s``, before the batch that counted on their
        room). A hand-off that fails leaves the version here, unloaded if still idle, as a
        demotion the node refused. False when this node failed."""
        ledger, entries, deadline = self.ledger, self.ledger.entries, self.settings.reload_deadline_s
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(self.across.hand_off(k, HOST, deadline) for k in keys), return_exceptions=True)
        seconds = time.monotonic() - started
        refused = []
        for key, outcome in zip(keys, outcomes):
            entry = entries.get(key)
            if entry is None or entry.state != READY or entry.moving != HOST:
                continue  # gone, or kept here meanwhile (``CacheManager.take``)
            if isinstance(outcome, str):
                self.handed(key, HOST, outcome, seconds)
                continue
            self.move_refused(key, HOST, outcome)
            if entry.leases == 0 and key not in ledger.pinned:
                self.evictions.evicted(key, "capacity")
                ledger.retire(key)
                refused.append(key)
        busy = [k for k in keys if k in entries and entries[k].away and entries[k].leases]
        if busy:  # requests routed here before the hand-off: the batch waits for their room
            await self.leases.idle(busy, deadline)
        leaving = refused + self.take_away()
        return not leaving or await self.unload(leaving)

    async def promote_across(self, key: Key) -> None:
        """Host tier: hand ``key`` (recorded as moving to GPU) back to its node on the ring; it
        answers here until that node holds it, then leaves once its requests here have ended."""
        started = time.monotonic()
        try:
            node = await self.across.hand_off(key, GPU, self.settings.load_timeout_s)
        except Exception as error:  # noqa: BLE001 - any failure leaves it here, answering
            if key in self.ledger.entries:
                self.move_refused(key, GPU, error)
                self.moves.failed(key, time.monotonic() + self.settings.failure_backoff_s)
            return
        entry = self.ledger.entries.get(key)
        if entry is not None and entry.state == READY and entry.moving == GPU:
            self.handed(key, GPU, node, time.monotonic() - started)
            self.signals.wake()  # it leaves once idle: the next step unloads it

    def handed(self, key: Key, tier: str, node: str, seconds: float) -> None:
        self.ledger.handed_off(key)
        if tier == GPU:  # a promotion's seconds price the next (a demotion's are a host load's)
            self.moves.moved(key, tier, seconds)
        self.events.moved(key, tier, seconds)
        log.info("node %s: %s %s version %s to %s in %.3f s", self.node,
                 "demoted" if tier == HOST else "promoted", key[0], key[1], node, seconds,
                 extra={"model": key[0], "version": key[1], "node": self.node, "tier": tier,
                        "duration_s": round(seconds, 6)})

    def move_refused(self, key: Key, tier: str, error: BaseException) -> None:
        self.ledger.move_failed(key)
        if not isinstance(error, errors.TfscacheError):
            error = errors.Internal(f"moving {key[0]} to {tier}: {error!r}")
        self.events.move_failed(key, tier, error)
        log.warning("node %s: moving %s version %s to the %s tier failed: %s: %s", self.node,
                    key[0], key[1], tier, error.grpc_code.name, error.message)

    def stop(self) -> None:
        """The cache stops: promotions under way are dropped (the version stays where it is)."""
        for task in list(self.promoting):
            task.cancel()

    def admit(self, key: Key) -> Entry:
        pending = self.ledger.pending[key]
        if pending.blocked_since is not None:
            self.events.room_waited(key, time.monotonic() - pending.blocked_since)
        return self.ledger.admitted(key, time.time())

    def prefetch(self, now: float, *, victims: bool) -> tuple[list[Key], list[Entry]]:
        """(victims, batch) of the prefetches with idle room (planner.plan_prefetch), beside this
        step's real loads (``victims`` False: free room only, for a batch that would otherwise wait
        for their memory to be measured free); stale ones (all, draining) dropped first."""
        stale = float("inf") if self.signals.draining else now - self.settings.prefetch_window_s
        self.ledger.drop_prefetches(stale)
        leaving, batch = [], []
        while (planned := plan_prefetch(self.ledger, self.caps, self.policy, now,
                                        victims=victims)) is not None:
            key, taken = planned
            for victim in taken:
                self.evictions.evicted(victim, "prefetch")
                self.ledger.retire(victim)
            self.prefetched.count("started")
            leaving += taken
            batch.append(self.admit(key))
        return leaving, batch

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
        blocked = [p.blocked_since for p in self.ledger.pending.values()
                   if p.blocked_since is not None]
        wait = None if not blocked else max(
            0.0, min(blocked) + self.settings.room_timeout_s - time.monotonic())
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
        """Measure the node (in a worker thread) and release what it has given back
        (cache/freeing.py)."""
        host, gpu = await asyncio.to_thread(self.memory_now)
        measured, expired = self.ledger.freed(host, gpu, time.monotonic())
        for record in measured:
            log.info("node %s: memory of %s measured free (%d bytes)", self.node,
                     names(list(record.keys)), record.bytes)
        for record in expired:
            log.warning("node %s: memory of %s (%d bytes) not measured free within "
                        "cache.free_wait_s = %s s; counting it free", self.node,
                        names(list(record.keys)), record.bytes, self.settings.free_wait_s)
        if measured or expired:
            self.signals.wake()  # a load may have waited for that room

    def take_evictions(self) -> list[Key]:
        """Versions ``evict`` marked UNLOADING, and while draining every idle one (pinned or
        not)."""
        sig, entries = self.signals, self.ledger.entries
        asked = sig.take_evictions()
        keys, reasons = [k for k, _ in asked], dict(asked)
        if sig.draining:
            for key, entry in list(entries.items()):
                if entry.state == READY and entry.leases == 0:
                    self.ledger.retire(key)
                    keys.append(key)
            if keys:
                log.info("node %s draining: unloading %s", self.node, names(keys))
        keys = [k for k in keys if k in entries]
        for key in keys:
            self.evictions.evicted(key, "drain" if sig.draining else reasons.get(key, "admin"))
        return keys

    def look(self, keys: list[Key]) -> tuple[list[Key], bool]:
        """In a worker thread: which of ``keys`` vanished from the repository (a stat each), and
        whether the node's process was replaced."""
        return self.repository.vanished(keys), self.adapter.restarted()

    def drop_vanished(self, gone_on_disk: list[Key]) -> list[Key]:
        """Entries whose version directory is gone: they leave the node, their waiters get
        NOT_FOUND."""
        entries = self.ledger.entries
        gone = [k for k in gone_on_disk if k in entries and entries[k].state != UNLOADING]
        for key in gone:
            log.warning("model %s version %s vanished from the repository; removing it from node "
                        "%s", key[0], key[1], self.node)
            self.evictions.evicted(key, "vanished")
            fail(self.ledger.retire(key), not_found(*key))
        return gone

    async def unload(self, leaving: list[Key]) -> bool:
        """The node without ``leaving``; returns once it reports each gone (the batch waits for
        that). Under a memory or GPU cap their bytes keep counting until measured free
        (cache/freeing.py)."""
        started, sizes = time.monotonic(), {k: self.ledger.entries[k].bytes for k in leaving}
        gpu = sum(self.ledger.entries[k].gpu_held for k in leaving)
        before = await asyncio.to_thread(self.memory_now) if self.holds_freed_memory() else None
        done = False
        try:
            wanted = self.ledger.wanted(loading=False)
            if self.before_unload is not None:  # every unload the reloader carries out comes here
                await self.before_unload(leaving)
            await self.adapter.unload(leaving, wanted, self.settings.reload_deadline_s)
            done = True
        except errors.TfscacheError as e:
            self.recovery.mark_unhealthy(
                f"unloading {names(leaving)}: {e.grpc_code.name}: {e.message}")
            return False
        finally:
            for key in leaving:
                self.ledger.unloaded(key)
                self.signals.unloaded(key)
                if self.moves is not None:
                    self.moves.forget(key)
            if done and before is not None:  # each cap in force waits for its own memory
                host = sum(sizes.values()) if self.caps.memory_bytes else 0
                gpu_freed = gpu if self.caps.gpu_bytes else 0
                self.ledger.free_later(Freeing(tuple(leaving), host, gpu_freed, *before,
                                               until=time.monotonic() + self.settings.free_wait_s))
            self.state_file.save()
        if before is not None:
            await self.check_freed()
        seconds = time.monotonic() - started
        for key in leaving:
            log.info("node %s: unloaded %s version %s in %.3f s (%d bytes)", self.node, key[0],
                     key[1], seconds, sizes[key],
                     extra={"model": key[0], "version": key[1], "node": self.node,
                            "duration_s": round(seconds, 6), "bytes": sizes[key]})
            self.events.unloaded(key, seconds, sizes[key])
        return True

    async def move(self, keys: list[Key], tier: str) -> bool:
        """Demote (``tier`` HOST) or promote (GPU) ``keys``, already recorded as moving, each in
        place on the node (``NodeAdapter.move``); they answer throughout and count against both
        tiers until moved. A demotion's GPU bytes, under a GPU cap, count until measured free, as
        an unload's do. A move the node refuses leaves the version where it was: a refused
        demotion is then unloaded if still idle (the planner counted on its GPU room). False when
        the node failed (it is then unhealthy)."""
        ledger, entries = self.ledger, self.ledger.entries
        gpu = sum(entries[k].gpu for k in keys) if tier == HOST and self.caps.gpu_bytes else 0
        before = await asyncio.to_thread(self.memory_now) if gpu else None
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(self.adapter.move(k, tier, self.settings.reload_deadline_s) for k in keys),
            return_exceptions=True)
        seconds = time.monotonic() - started
        refused, failed = [], None
        for key, error in zip(keys, outcomes):
            if error is None:
                ledger.moved(key, seconds)
                self.moves.moved(key, tier, seconds)
                self.events.moved(key, tier, seconds)
                log.info("node %s: %s %s version %s in %.3f s", self.node,
                         "demoted" if tier == HOST else "promoted", key[0], key[1], seconds,
                         extra={"model": key[0], "version": key[1], "node": self.node,
                                "tier": tier, "duration_s": round(seconds, 6)})
                continue
            ledger.move_failed(key)
            if not isinstance(error, errors.TfscacheError):
                error = errors.Internal(f"moving {key[0]} to {tier}: {error!r}")
            self.events.move_failed(key, tier, error)
            if isinstance(error, (errors.Unavailable, errors.DeadlineExceeded)):
                failed = error
                continue
            log.warning("node %s: moving %s version %s to the %s tier failed: %s: %s", self.node,
                        key[0], key[1], tier, error.grpc_code.name, error.message)
            if tier == HOST and key in entries and entries[key].leases == 0 and not (
                    key in ledger.pinned):
                refused.append(key)
        if before is not None:
            moved = tuple(k for k, e in zip(keys, outcomes) if e is None)
            ledger.free_later(Freeing(moved, 0, sum(entries[k].gpu for k in moved), None,
                                      before[1], until=time.monotonic() + self.settings.free_wait_s))
        if failed is not None:
            self.recovery.mark_unhealthy(f"moving {names(keys)} to the {tier} tier: "
                                         f"{failed.grpc_code.name}: {failed.message}")
            return False
        for key in refused:
            self.evictions.evicted(key, "capacity")
            ledger.retire(key)
        return not refused or await self.unload(refused)

    async def load(self, batch: list[Entry]) -> None:
        if not self.repository.local:  # a bucket: each version into the disk tier first
            batch = await self.fetch(batch)
            if not batch:
                return
        rss_before, gpu_before = await asyncio.to_thread(self.memory_now)
        started = time.monotonic()
        # Prefetches beside real loads load apart, each answered as it ends.
        real = [e for e in batch if not e.prefetched]
        parts = [real] + [[e] for e in batch if e.prefetched] if real else [batch]
        outcomes = await asyncio.gather(*(self.load_part(part, started, len(parts) > 1)
                                          for part in parts))
        load_s = time.monotonic() - started
        if None in outcomes:
            return
        loaded = [e for part, results in zip(parts, outcomes) for e in part
                  if results.get(e.key) is None]
        rss_after, gpu_after = await asyncio.to_thread(self.memory_now)
        measure(loaded, rss_before, rss_after, self.caps, self.ledger)
        grown = share_growth({e.key: e.bytes for e in loaded}, gpu_before, gpu_after)
        for key, size in grown.items():
            self.ledger.learn_gpu(key, size)
        if len(parts) == 1:  # settled once measured: its log lines carry the bytes
            self.settle(batch, outcomes[0], load_s)
        self.state_file.save()

    async def load_part(self, part: list[Entry], started: float, apart: bool) -> dict | None:
        """The adapter's results for ``part``, settled at once when ``apart`` (beside other parts);
        None when the node failed (it is then unhealthy)."""
        keys = [e.key for e in part]
        try:
            results = await self.adapter.load(keys, self.ledger.wanted(),
                                              self.settings.reload_deadline_s)
        except errors.TfscacheError as e:
            if self.signals.healthy:
                self.recovery.mark_unhealthy(f"reload loading {names(keys)}: {e.message}")
            return None
        if not self.signals.healthy:  # another part found the node failed: it recovers everything
            return None
        if apart:
            self.settle(part, results, time.monotonic() - started)
        return results

    def settle(self, part: list[Entry], results: dict, load_s: float) -> None:
        """Record what the node did with ``part`` (``results``: the adapter's) and answer its
        waiters."""
        now = time.monotonic()
        for entry in part:
            if results.get(entry.key) is None:
                self.loaded(entry, load_s, now)
        failed = [(e, results[e.key]) for e in part if results.get(e.key) is not None]
        for entry, error in failed:
            self.load_failed(entry, error, load_s, now)
        if any(isinstance(error, errors.Unavailable) for _, error in failed):
            self.recovery.mark_unhealthy(
                f"checking status of {names([e.key for e in part])}: node unavailable")

    async def fetch(self, batch: list[Entry]) -> list[Entry]:
        """Download the batch's versions (tfscache.storage); the ones that failed fail their
        requests with the store's error, without the failure backoff: the next request tries
        again."""
        started, deadline_s = time.monotonic(), self.settings.reload_deadline_s
        downloads = (asyncio.wait_for(self.repository.prepare(*e.key), deadline_s) for e in batch)
        results = await asyncio.gather(*downloads, return_exceptions=True)
        now = time.monotonic()
        for entry, error in zip(batch, results):
            if isinstance(error, TimeoutError):
                error = errors.DeadlineExceeded(
                    f"downloading model {entry.key[0]} version {entry.key[1]} took longer than "
                    f"cache.reload_deadline_s = {deadline_s} s")
            if isinstance(error, BaseException):
                self.load_failed(entry, error, now - started, now, backoff=False)
        return [e for e, error in zip(batch, results) if not isinstance(error, BaseException)]

    def loaded(self, entry: Entry, load_s: float, now: float) -> None:
        if entry.prefetched:
            self.prefetched.count("completed")
        waiters = self.ledger.loaded(entry.key, load_s, now)
        log.info("node %s: loaded %s version %s in %.3f s (%d bytes%s)", self.node, entry.key[0],
                 entry.key[1], load_s, entry.bytes, "" if entry.measured else ", estimated",
                 extra={"model": entry.key[0], "version": entry.key[1], "node": self.node,
                        "duration_s": round(load_s, 6), "bytes": entry.bytes,
                        "measured": entry.measured})
        self.events.loaded(entry.key, load_s, entry.bytes, entry.measured)
        for fut in waiters:
            if not fut.done():
                fut.set_result(self.leases.grant(entry, counted=not isinstance(fut, HandOff)))

    def load_failed(self, entry: Entry, error: BaseException, load_s: float, now: float, *,
                    backoff: bool = True) -> None:
        if not isinstance(error, errors.TfscacheError):
            error = errors.Internal(f"checking load of {entry.key[0]}: {error!r}")
        log.warning("node %s: loading %s version %s failed after %.3f s: %s: %s", self.node,
                    entry.key[0], entry.key[1], load_s, error.grpc_code.name, error.message,
                    extra={"model": entry.key[0], "version": entry.key[1], "node": self.node,
                           "duration_s": round(load_s, 6), "bytes": entry.bytes})
        if errors.is_out_of_memory(error.message) and not entry.prefetched:
            if not entry.retried:  # make room (planner rule 3) and load it once more
                size = grown(entry.bytes or self.ledger.typical_size())
                log.warning("node %s: out of memory loading %s version %s; unloading idle "
                            "models for %d bytes and loading it again", self.node,
                            entry.key[0], entry.key[1], size,
                            extra={"model": entry.key[0], "version": entry.key[1],
                                   "node": self.node, "bytes": size})
                self.ledger.retry_load(entry.key, size, now)
                self.signals.wake()
                return
            error = errors.ResourceExhausted(
                oom_message(self.ledger, self.caps, entry.key, self.node, "loading", None))
        self.events.load_failed(entry.key, load_s, error)
        if entry.prefetched:  # counted apart, and no backoff: the next request loads it again
            self.prefetched.count("failed")
        until = now + self.settings.failure_backoff_s if backoff and not entry.prefetched else None
        fail(self.ledger.failed(entry.key, error, until), error)

    async def send(self, deadline_s: float, why: str, *, loading: bool = True) -> bool:
        """Send what the node should serve; False (and the node unhealthy) if that fails."""
        try:
            await self.adapter.sync(self.ledger.wanted(loading=loading), deadline_s)
            return True
        except errors.TfscacheError as e:
            self.recovery.mark_unhealthy(f"reload {why}: {e.grpc_code.name}: {e.message}")
            return False
