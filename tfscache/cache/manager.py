"""Per-node cache manager: the façade the front end and admin use; one TF Serving (or other) node each.

``acquire(name, version)`` returns a ``Lease`` once that version is AVAILABLE on the
node; a model with a lease is never unloaded. A hit takes no lock and awaits nothing; for
``Latest(NAME)`` it reads the repository's remembered newest version, so it lists the model's
directory (off the loop) only once per ``rescan_s``. A cold model joins the ledger's pending set and
wakes the reloader,
which plans (``tfscache.cache.planner``), unloads victims and loads batches through the
node's adapter (``tfscache.cache.adapter``). The pieces:

* ``ledger``: resident entries, pending loads, leases, pins, failures, learned sizes;
* ``planner``: the pure ``plan(ledger, caps, policy, now)`` the simulator shares;
* ``reloader`` and ``recovery``: the only code that talks to the node; the reloader returns the
  pinned versions the node lost, and the manager loads and pins them again;
* ``lease``: the leases, granted to hits here and to loaded waiters by the reloader;
* ``state``: the state file, written coalesced off the event loop;
* ``policy``: the eviction policies, by name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from tfscache import errors, logs
from tfscache.cache.across import Across
from tfscache.cache.adapter import NodeAdapter
from tfscache.cache.events import CacheEvents
from tfscache.cache.lease import Lease, Leases
from tfscache.cache.ledger import (
    LOADING,
    READY,
    UNLOADING,
    Entry,
    HandOff,
    Key,
    Ledger,
    QueuedLoad,
    ResidentModel,
)
from tfscache.cache.planner import Caps, grown, oom_message, room_victims
from tfscache.cache.moves import TierMoves
from tfscache.cache.prefetcher import Prefetcher
from tfscache.cache.policy import EvictionPolicy, make_policy
from tfscache.cache.reloader import Reloader
from tfscache.cache.signals import Signals, copy_error
from tfscache.cache.state import CacheState, LostPins, SavedVersion, StateFile, load_state
from tfscache.cache.tiers import GPU, HOST, PromoteRule
from tfscache.repository.local import ModelRepository, check_name
from tfscache.settings import CacheSection
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.cache")


class CacheManager:
    """Owns one node's wanted set: loads on demand, evicts idle models under the caps."""

    def __init__(
        self,
        adapter: NodeAdapter,
        repository: ModelRepository,
        settings: CacheSection,
        policy: EvictionPolicy | None = None,
        state_file: Path | None = None,
        events: CacheEvents | None = None,
        gpu=None,
        gpu_cap: int = 0,
        before_unload=None,
        across: Across | None = None,
        tier: str = GPU,
    ) -> None:
        """``adapter``: the node, as its kind drives it (tfscache.kinds.table). ``gpu`` and ``gpu_cap``:
        with a GPU cap in force (tfscache.kinds.gpumem.gpu_cap), the node's GPU memory
        (``NodeGpuMemory``), read around each load to learn each model's GPU size, and the cap in bytes.
        ``before_unload(keys)``: awaited before the node is told to unload ``keys`` (tfscache.workers).
        ``tier``: the node's (``gpu``, or ``host`` for a host-tier node); ``across``: with
        host-tier nodes and ``cache.demote = host``, the nodes of the other tier, which this
        cache hands its demotions (GPU tier) or promotions (host tier) to (tfscache.cache.across).
        """
        self.node = adapter.client
        self.target = adapter.target
        self.events = events or CacheEvents()
        self.repository = repository
        self.settings = settings
        self.caps = Caps(
            settings.max_models_per_node, settings.memory_per_node, gpu_bytes=gpu_cap if gpu else 0
        )
        self.policy = policy or make_policy(settings.policy, settings)
        self.policy.set_caps(settings.max_models_per_node, settings.memory_per_node)
        # the policy hears of each transition from the ledger
        self.ledger = Ledger(self.policy, tier=tier)
        self._signals = Signals()
        self.adapter = adapter
        self._prefetcher = (Prefetcher(self.ledger, self._signals, self._estimate, settings)
                            if settings.prefetch else None)  # co-access prefetch, docs/prefetch.md
        self.prefetch_counts = self._prefetcher.counts if self._prefetcher is not None else None
        # demotion and promotion (cache.demote = host): across nodes, else where the node moves
        # models in place
        rule = PromoteRule(settings.promote_horizon_s, settings.promote_queue)
        if settings.demote != HOST:
            self.moves = None
        elif across is not None:
            self.moves = TierMoves(self.ledger, (lambda key: across.available(HOST) and (
                not adapter.demotes_in_place or adapter.can_demote(key))) if tier == GPU
                else _never, rule)
        else:
            self.moves = (TierMoves(self.ledger, adapter.can_demote, rule)
                          if adapter.demotes_in_place else None)
        self._leases = Leases(self.ledger, self._signals, self.prefetch_counts, self.moves)
        self._lost_pins = LostPins()  # pinned versions the node lost, until pinned again
        # Coalesced writes, each in a worker thread; the reloader saves through it too.
        self._state_file = StateFile(state_file, self.target, self.ledger, self._lost_pins)
        self._reloader = Reloader(adapter, self.ledger, self.policy, self.caps, repository,
                                  self._signals, settings, self.events, leases=self._leases,
                                  state_file=self._state_file, lost_pins=self._lost_pins, gpu=gpu,
                                  prefetch=self.prefetch_counts, moves=self.moves,
                                  before_unload=before_unload, across=across)
        self._task: asyncio.Task | None = None
        self._repins: dict[Key, asyncio.Task] = {}  # lost pins being loaded and pinned again

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self._signals.healthy

    async def start(self) -> None:
        """Start the reloader; it re-adopts what the state file says the node serves, in the background.

        Returns at once. Until the node answered and the saved models were re-adopted the
        cache is not healthy (``wait_ready``): requests wait for it, and a node that is not
        listening yet (a pod whose containers start together) or is busy with a long load
        (this process restarted under it) delays nothing else. The wanted set that clears
        what the node serves beyond the adopted models is sent by the reloader's first step.
        """
        state = await asyncio.to_thread(load_state, self._state_file.path)
        self._signals.starting_because(f"starting: waiting for node {self.target} to answer")
        self._task = asyncio.create_task(self._run(state), name=f"tfscache-cache-{self.target}")

    async def wait_ready(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` s (None: no limit) until the cache is healthy; whether it is."""
        sig = self._signals
        if sig.closed:
            return False
        try:
            async with asyncio.timeout(timeout):
                await sig.wait_ready()
        except TimeoutError:
            pass
        return sig.healthy and not sig.closed

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the node has been sent this cache's wanted set since start-up (it cleared the rest)."""
        async with asyncio.timeout(timeout):
            await self._signals.wait_synced()

    async def stop(self) -> None:
        """Stop loading; waiters get UNAVAILABLE. The node keeps serving; the NodeClient stays open."""
        sig = self._signals
        sig.close("its cache manager stopped")  # ``wait_ready`` callers wake and see it closed
        for task in self._repins.values():
            task.cancel()
        self._reloader.stop()
        if self._prefetcher is not None:
            self._prefetcher.stop()
        if self._task is not None:
            await cancel(self._task)
            self._task = None
        sig.fail_all(
            self.ledger, errors.NodeUnavailable(f"cache manager for node {self.target} stopped")
        )
        self._save()
        await self._state_file.close()  # nothing is saved after the last write
        close = getattr(self.adapter, "close", None)  # optional (tfscache.cache.adapter)
        if close is not None:
            await close()

    async def flush_state(self) -> None:
        """Wait until the state file holds every change made so far (fsynced); ``errors.Internal``
        if the write failed."""
        await self._state_file.flush()

    @property
    def state_writes(self) -> int:
        """How many times the state file was written since start (coalesced writes count once)."""
        return self._state_file.writes

    async def _durable(self, done: str) -> None:
        """Before an admin operation's reply: the state file holds its change (``done``), so a crash
        right after the reply keeps it. Concurrent operations share one coalesced write."""
        try:
            await self.flush_state()
        except errors.Internal as exc:
            raise errors.Internal(f"{done} on node {self.target}, but {exc.message}; "
                                  "a restart of this process would lose it") from exc

    # -- requests ------------------------------------------------------------------------

    async def acquire(
        self, name: str, version: int | None = None, timeout: float | None = None
    ) -> Lease:
        """A lease on ``name`` at ``version`` (None: the highest on disk), loading it if needed.
        A model or version the repository lacks is NOT_FOUND in the node kind's words."""
        try:
            return await self._acquire(name, version, timeout)
        except errors.ModelNotFound as missing:
            raise self._worded(missing) from None

    def _worded(self, missing: errors.ModelNotFound) -> errors.ModelNotFound:
        """The repository's neutral NOT_FOUND in the node kind's words (``NodeAdapter.missing``)."""
        return self.adapter.missing(missing)

    async def _acquire(self, name: str, version: int | None, timeout: float | None) -> Lease:
        # re-adopting what the node serves: its first answer comes within seconds
        if self._signals.starting:
            await self.wait_ready(timeout)
        # A hit: the remembered latest version (listed at most once per rescan_s), no await.
        latest = version if version is not None else self.repository.remembered_latest(name)
        if latest is None and version is None:  # not listed within rescan_s: list it, off the loop
            latest = await asyncio.to_thread(self.repository.latest_version, name)
        entry = self.ledger.ready((name, latest)) if latest is not None else None
        if entry is not None and not self._signals.draining:
            self.events.hit(entry.key)
            if self._prefetcher is not None:
                self._prefetcher.after(entry.key)
            return self._prefetch_used(self._leases.grant(entry))
        # its followers load beside it: docs/prefetch.md
        prefetcher, guess = self._prefetcher, (name, latest)
        follow = prefetcher.wanted(guess) if prefetcher is not None and latest is not None else []
        # one trip
        found, sizes, follow_sizes = await asyncio.to_thread(self._resolve, name, version, follow)
        key = (found.name, found.version)
        self.events.miss(key)
        fut = await self._enqueue(key, sizes)
        if prefetcher is not None:  # no await since the enqueue: one reloader step sees both
            prefetcher.cold(key, follow_sizes if key == guess else None)
        lease = await self._wait_lease(fut, key, timeout)
        if prefetcher is not None:
            prefetcher.answered(key)
        return self._prefetch_used(lease)

    async def _wait_lease(self, fut: asyncio.Future, key: Key, timeout: float | None) -> Lease:
        """The lease ``fut`` brings within ``timeout`` s (DEADLINE_EXCEEDED after); a lease granted
        just as the caller gave up goes straight back."""
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().release()
            fut.cancel()
            if isinstance(exc, TimeoutError):
                raise errors.DeadlineExceeded(
                    f"Timed out after {timeout} s waiting for model {key[0]} version {key[1]} "
                    f"to load on node {self.target}") from None
            raise

    def in_flight_elsewhere(self, name: str, version: int, count: int) -> None:
        """Worker processes run ``count`` requests on ``(name, version)`` now (tfscache.workers): no
        victim."""
        self.ledger.in_flight_elsewhere((name, version), count)
        if count == 0 and (self.ledger.pending or self._signals.over_cap):
            self._signals.wake()  # a load waiting for room may find it now

    async def recheck(self) -> None:
        """The node answered NOT_FOUND for a model held as AVAILABLE: it may have lost its models
        (TF Serving restarted behind a sidecar). The reloader checks each resident model and, if
        the node lost any, sends them again and waits for them; this returns once that is done.
        Concurrent callers share one check, so a restart costs one reload."""
        await self._signals.request_recheck()

    def is_resident(self, name: str, version: int | None = None) -> bool:
        """Whether that version is AVAILABLE here (cheap, no file access; for routing to a replica)."""
        try:
            check_name(name)
        except errors.TfscacheError:
            return False
        if version is None:
            version = self.repository.remembered_latest(name, fresh=False)
        return version is not None and self.ledger.held((name, version))

    def wanted(self) -> list[Key]:
        """The versions the node should serve now (loading ones included)."""
        return self.ledger.wanted()

    def state_of(self, name: str, version: int) -> str | None:
        """``LOADING``, ``READY`` or ``UNLOADING`` for a version in the node's wanted set, else None
        (what the disk tier asks before it drops a version's files)."""
        return self.ledger.state_of((name, version))

    def failure(self, name: str, version: int) -> errors.TfscacheError | None:
        """The error of the version's last load while requests still get it (``failure_backoff_s``),
        a NOT_FOUND in the node kind's words."""
        failure = self.ledger.failure((name, version), time.monotonic())
        return self._worded(failure) if isinstance(failure, errors.ModelNotFound) else failure

    def queue(self) -> list[QueuedLoad]:
        """Cold model versions waiting for a reload, with their waiting requests."""
        return [
            QueuedLoad(p.key[0], p.key[1], len(p.live()), p.estimate, p.blocked_since is not None)
            # not a prefetch alone
            for p in self.ledger.pending.values()
            if p.live() or not p.prefetch
        ]

    def snapshot(self) -> list[ResidentModel]:
        return [self._describe(e) for e in self.ledger.entries.values()]

    def gpu_usage(self) -> tuple[int, int]:
        """(GPU bytes of the versions in the node's config, as learned at their loads; the GPU cap
        in force, 0 = none): docs/gpu.md."""
        return self.ledger.gpu_used(), self.caps.gpu_bytes

    # -- admin operations (tfscache.admin) -----------------------------------------------

    @property
    def draining(self) -> bool:
        """True once ``drain`` was called: every new acquire gets UNAVAILABLE."""
        return self._signals.draining

    async def preload(
        self, name: str, version: int | None = None, timeout: float | None = None
    ) -> ResidentModel:
        """Load ``name`` (version None: the highest on disk) unless resident; errors as ``acquire``'s."""
        lease = await self.acquire(name, version, timeout)
        lease.release()
        await self._durable(f"loaded model {lease.name} version {lease.version}")
        return self._resident((lease.name, lease.version))

    async def take(self, name: str, version: int, timeout: float) -> None:
        """Load ``(name, version)``, handed over by a node of the other tier
        (tfscache.cache.across), unless it is resident here; return once it is. No request is
        counted (no hit, no miss, none for the tier rules), and with no room here now it is
        refused at once (RESOURCE_EXHAUSTED) rather than waiting for room. A version here that
        was on its way to the other tier stays."""
        if self._signals.starting:
            await self.wait_ready(timeout)
        key = (name, version)
        entry = self.ledger.ready(key)
        if entry is not None and not self._signals.draining:
            if entry.away or entry.moving is not None:
                self.ledger.move_failed(key)  # it stays here after all
            return
        found, sizes, _ = await asyncio.to_thread(self._resolve, name, version, [])
        key = (found.name, found.version)
        fut = await self._enqueue(key, sizes, handoff=True)
        (await self._wait_lease(fut, key, timeout)).release()

    async def pin(
        self, name: str, version: int | None = None, timeout: float | None = None
    ) -> ResidentModel:
        """Load if needed and keep resident: the policy never chooses a pinned version as a victim."""
        lease = await self.acquire(name, version, timeout)
        self.ledger.pin((lease.name, lease.version))
        lease.release()
        self._save()
        await self._durable(f"pinned model {lease.name} version {lease.version}")
        return self._resident((lease.name, lease.version))

    async def unpin(self, name: str, version: int | None = None) -> list[Key]:
        """Make pinned versions of ``name`` (all when ``version`` is None) evictable again."""
        keys = sorted(k for k in self.ledger.pinned if k[0] == name and version in (None, k[1]))
        if not keys:
            raise errors.NotFound(
                f"model {name}{_version(version)} is not pinned on node {self.target}"
            )
        self.ledger.unpin(keys)
        self._lost_pins.unpinned(keys)
        self._save()
        self._signals.wake()  # a load may have been waiting for the room the pin held
        await self._durable(f"unpinned model {name}{_version(version)}")
        return keys

    async def evict(self, name: str, version: int | None = None) -> list[Key]:
        """Unload idle resident versions of ``name`` (all when ``version`` is None) now; wait until gone."""
        check_name(name)
        entries = self.ledger.entries
        keys = [
            k
            for k, e in entries.items()
            if k[0] == name and version in (None, k[1]) and e.state != UNLOADING
        ]
        if not keys:
            raise errors.NotFound(
                f"model {name}{_version(version)} is not resident on node {self.target}"
            )
        busy = [entries[k] for k in keys if entries[k].state != READY or entries[k].leases
                or k in self.ledger.pinned]
        if busy:
            raise errors.FailedPrecondition(
                f"not evicting from node {self.target}: "
                + "; ".join(
                    f"model {e.key[0]} version {e.key[1]} "
                    + (
                        f"is held by {e.leases} lease{'s' if e.leases != 1 else ''} (requests in flight)"
                        if e.leases
                        else "is loading" if e.state == LOADING else "is pinned (unpin it first)"
                    )
                    for e in busy
                )
            )
        futures = []
        for key in keys:
            self.ledger.retire(key)
            futures.append(self._signals.request_evict(key))
        self._signals.wake()
        await asyncio.gather(*futures)
        await self._durable(f"evicted model {name}{_version(version)}")
        return sorted(keys)

    async def out_of_memory(self, name: str, version: int) -> list[Key]:
        """The node ran out of memory running a request of ``(name, version)`` (leased by the
        caller): from now on it counts half as much again, and idle versions other than it are
        unloaded, in the policy's order, until their bytes reach that (at least one; never one
        with a lease, a pin or loading). Returns those versions once the node reports them gone,
        for the caller to try the request once more (tfscache.frontend.backends)."""
        key, ledger = (name, version), self.ledger
        entry = ledger.entries.get(key)
        size = grown(entry.bytes if entry is not None and entry.bytes else ledger.typical_size())
        ledger.grew(key, size)
        victims = room_victims(ledger, self.policy, key, size, time.monotonic())
        log.warning("node %s: out of memory running %s version %s; unloading %s", self.target,
                    name, version, ", ".join(f"{n} version {v}" for n, v in victims) or "nothing",
                    extra={"model": name, "version": version, "node": self.target})
        futures = []
        for victim in victims:
            ledger.retire(victim)
            futures.append(self._signals.request_evict(victim, "out_of_memory"))
        self._save()
        self._signals.wake()
        await asyncio.gather(*futures)
        return victims

    def oom_message(self, name: str, version: int, unloaded: list[Key]) -> str:
        """RESOURCE_EXHAUSTED text for a request that ran the node out of memory again after
        ``out_of_memory`` unloaded ``unloaded``: the caps and what holds the node."""
        return oom_message(self.ledger, self.caps, (name, version), self.target, "running",
                           unloaded)

    async def drain(self) -> None:
        """Refuse new acquires, let leases and queued loads finish, then unload every model."""
        await self._signals.request_drain()
        await self._durable("drained")

    # -- internals -----------------------------------------------------------------------

    async def _run(self, state: CacheState) -> None:
        """The node's task: the reloader's start-up, then its turns, one after another. What each
        hands back (pinned versions the node lost) is loaded and pinned again here."""
        logs.bind(node=self.target)  # this task's log lines name the node
        self._restore_pins(await self._reloader.startup(state))
        while True:
            self._restore_pins(await self._reloader.work())

    def _restore_pins(self, lost: list[SavedVersion]) -> None:
        """Start loading and pinning again each of ``lost`` not already being loaded."""
        for saved in lost:
            key = (saved.name, saved.version)
            if key not in self._repins:
                self._repins[key] = asyncio.create_task(self._repin(saved),
                                                        name=f"repin {key[0]}:{key[1]}")

    async def _repin(self, saved: SavedVersion) -> None:
        """Load and pin again a version that was pinned but the node lost (at start-up: since the
        state was saved; later: a recovery or a resync found it gone).

        Until it is pinned again it stays in the state file as pinned (``LostPins``), so a crash
        meanwhile loses no pin; a load that fails drops the pin (the log says so).
        """
        key = (saved.name, saved.version)
        try:
            await self.pin(*key)
        except errors.TfscacheError as e:
            self._repins.pop(key, None)
            self._lost_pins.finish(key)
            self.ledger.unpin([key])
            self._save()
            log.warning("node %s: model %s version %s was pinned but the node lost it; loading it "
                        "again failed (%s: %s): pin it again", self.target, key[0], key[1],
                        e.grpc_code.name, e.message)
        else:
            self._repins.pop(key, None)
            if not self._lost_pins.finish(key):  # unpinned while it was being loaded again
                self.ledger.unpin([key])
            self._save()
            log.info("node %s: model %s version %s loaded and pinned again (the node had lost it)",
                     self.target, key[0], key[1])

    def _resident(self, key: Key) -> ResidentModel:
        # evicted between the lease and now: only under extreme churn
        if key not in self.ledger.entries:
            raise errors.Aborted(
                f"model {key[0]} version {key[1]} was unloaded again before it could be reported"
            )
        return self._describe(self.ledger.entries[key])

    def _describe(self, e: Entry) -> ResidentModel:
        return ResidentModel(e.key[0], e.key[1], e.bytes, e.measured, e.leases, e.last_use, e.state,
                             e.key in self.ledger.pinned, e.tier, e.moving or "")

    def _prefetch_used(self, lease: Lease) -> Lease:
        if lease.prefetched:  # told in the request's task: the request log marks it
            self.events.prefetch_used((lease.name, lease.version))
        return lease

    def _resolve(self, name: str, version: int | None,
                 follow: list[Key]) -> tuple[object, tuple[int, int] | Exception | None, dict]:
        """In a worker thread: the version to load (lists the model's directory) and, unless it is
        already loading or queued, its size estimate (walks the version directory) or why not; and
        the sizes of ``follow``, its likely followers to prefetch (``Prefetcher.estimates``)."""
        found = self.repository.resolve(name, version)
        key = (found.name, found.version)
        follow_sizes = self._prefetcher.estimates(follow) if follow else {}
        entry = self.ledger.entries.get(key)  # a hint: _enqueue decides again, on the loop
        if key in self.ledger.pending or (entry is not None and entry.state != UNLOADING):
            return found, None, follow_sizes
        try:
            return found, self._estimate(key), follow_sizes
        except errors.TfscacheError as exc:
            return found, exc, follow_sizes

    async def _enqueue(
        self, key: Key, sizes: tuple[int, int] | Exception | None = None, handoff: bool = False
    ) -> asyncio.Future:
        """A future for a lease on cold ``key``, joined to its load (one load per key);
        ``handoff``: a ``HandOff``'s (``take``)."""
        self._check_loadable(key)
        estimate = disk = 0
        entry = self.ledger.entries.get(key)
        if key not in self.ledger.pending and (entry is None or entry.state == UNLOADING):
            if sizes is None:  # it was queued when looked at; no longer
                sizes = await asyncio.to_thread(self._estimate, key)  # walks the version directory
                self._check_loadable(key)  # re-check after the await
            if isinstance(sizes, Exception):
                raise sizes
            estimate, disk = sizes
        entry = self.ledger.entries.get(key)
        loop = asyncio.get_running_loop()
        fut = HandOff(loop=loop) if handoff else loop.create_future()
        if entry is not None and entry.state == READY:
            fut.set_result(self._leases.grant(entry, counted=not handoff))
        elif self.ledger.requested(key, fut, estimate, disk, time.monotonic()):
            self._signals.wake()
        return fut

    def _check_loadable(self, key: Key) -> None:
        sig = self._signals
        if sig.closed or not sig.healthy:
            raise errors.NodeUnavailable(f"node {self.target} is unhealthy: {sig.reason}")
        if sig.draining:
            raise errors.NodeUnavailable(f"node {self.target} is draining")
        failure = self.ledger.failure(key, time.monotonic())
        if failure is not None:
            raise copy_error(failure)

    def _estimate(self, key: Key) -> tuple[int, int]:
        """(bytes the version will take, its size on disk): learned on an earlier load, else 1.2 x disk
        (at least the node's typical learned size where the adapter says disk sizes mean little).

        Only the estimate from disk can refuse a model as larger than the memory cap: a
        learned size carries the noise of RSS sampling, so above the cap it counts as the
        whole cap (the model then loads alone) rather than failing requests.
        """
        disk = self.repository.disk_bytes(*key)
        estimate = int(disk * self.settings.estimate_factor)
        cap = self.settings.memory_per_node
        if cap and estimate > cap:
            raise errors.CapacityExhausted(
                f"model {key[0]} version {key[1]} needs {estimate} bytes "
                f"({self.settings.estimate_factor} x its size on disk), more than "
                f"memory_bytes={cap} of node {self.target}")
        size = self.ledger.learned.get(key)
        if size is None:  # never loaded here: its size on disk, or what models here typically take
            size = (
                estimate
                if self.adapter.sizes_on_disk
                else max(estimate, self.ledger.typical_size())
            )
        return (min(size, cap) if cap else size), disk

    def _save(self) -> None:
        """Have the state file written soon (many changes in a row make one write, off the loop)."""
        self._state_file.save()

    # -- asked from outside the cache: the one way in (nothing outside reads its parts) ----------

    def used_elsewhere(self, name: str, version: int, requests: int, last_use: float) -> None:
        """``requests`` served on ``(name, version)`` outside this process (a worker, under its
        delegation: tfscache.workers.usage), the last at wall-clock ``last_use``. Each counts as
        a request that held a lease and gave it back: the first sets the entry's last use, the
        policy hears of every one, and the release runs as a local one does (it may wake the
        reloader). Nothing when the version is not AVAILABLE here."""
        key = (name, version)
        if requests <= 0 or self.ledger.ready(key) is None:
            return
        now = time.monotonic()
        self.ledger.leased(key, last_use, now)
        self._leases.release(key)
        for _ in range(requests - 1):
            self.ledger.accessed(key, now)

    def served_elsewhere(self, name: str, version: int) -> None:
        """One request on ``(name, version)`` answered outside this process, told in the order
        the requests came (HAProxy's log of a routed request: tfscache.dataplane.requests). The
        co-access prefetch learns from it as from a hit here, and its likely cold followers are
        queued; the policy hears of it through ``used_elsewhere``. Nothing when the version is
        not AVAILABLE here or prefetch is off."""
        key = (name, version)
        if self._prefetcher is not None and self.ledger.ready(key) is not None:
            self._prefetcher.after(key)

    def resident_version(self, name: str, version: int | None = None) -> int | None:
        """The version a hit on ``name`` at ``version`` would lease (None: the highest on disk as
        remembered within ``rescan_s``), when it is AVAILABLE here; else None. No file access."""
        if version is None:
            version = self.repository.remembered_latest(name)
        return version if version is not None and self.is_resident(name, version) else None

    async def version_on_disk(self, name: str, version: int | None = None) -> int:
        """The version a request for ``name`` at ``version`` (None: the highest on disk) would
        load, read off the loop (it lists the model's directory); it loads nothing. Raises
        ``ModelNotFound`` or ``UnsafeModelName`` as ``acquire`` does."""
        try:
            found = await asyncio.to_thread(self.repository.resolve, name, version)
        except errors.ModelNotFound as missing:
            raise self._worded(missing) from None
        return found.version

    @property
    def lost_texts(self) -> tuple[str, ...]:
        """How this node's kind says it does not serve a model (the adapter's ``lost_texts``):
        a reply starting so, for a leased version, means the node lost it (``recheck``)."""
        return self.adapter.lost_texts


def _never(key: Key) -> bool:
    """A host-tier node demotes nothing: its victims are unloaded."""
    return False


def _version(version: int | None) -> str:
    return "" if version is None else f" version {version}"
