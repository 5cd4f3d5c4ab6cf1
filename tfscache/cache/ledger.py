"""The ledger of one node's cache: what is resident, what waits to load, leases, pins, failures, sizes.

Plain bookkeeping with no I/O and no asyncio beyond holding the futures of waiting
requests: the manager records acquires and releases here, the planner reads it, the
reloader records what the node did. ``Key`` is ``(model name, version)``.

An ``Entry`` is a version in the node's config: LOADING (sent, not yet AVAILABLE),
READY (AVAILABLE; leases may be taken) or UNLOADING (left the config; counts against
the caps until the node reports it gone). A ``Pending`` is a cold version that
requests wait for and the planner has not admitted yet.

A resident entry has a tier (tfscache.cache.tiers): ``gpu`` or ``host`` (loaded on CPU
instances, still answering; docs/tiers.md). Its GPU bytes count against the GPU cap only on the
GPU tier, and while it moves to or from there (``moving``): a version counts against both
tiers while it moves. Its host bytes and the count cap count it on either tier.

Across nodes (host-tier nodes, docs/tiers.md) a ledger is one node's, and every entry has that
node's tier. A version moving to another node keeps answering here until that node holds it;
then it is ``away`` (``handed_off``): no longer routed here (``held`` is False), served to the
requests already here, and unloaded once idle.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tfscache import errors
from tfscache.cache.freeing import Freeing
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.tiers import GPU, HOST

Key = tuple[str, int]

LOADING, READY, UNLOADING = "loading", "available", "unloading"


class Entry:
    """A model version in the node's config (or leaving it)."""

    __slots__ = (
        "key",
        "state",
        "bytes",
        "disk",
        "measured",
        "leases",
        "last_use",
        "waiters",
        "gpu",
        "prefetched",
        "retried",
        "tier",
        "moving",
        "load_s",
        "away",
    )

    def __init__(self, key: Key, state: str, size: int, measured: bool, last_use: float,
                 disk: int = 0, tier: str = GPU) -> None:
        self.key = key
        self.disk = disk
        self.state = state
        self.bytes = size
        self.measured = measured
        self.leases = 0
        self.last_use = last_use  # wall-clock seconds
        self.waiters: list[asyncio.Future] = []
        # GPU bytes: learned from the growth across a load (tfscache.kinds.gpumem); 0 = none known
        self.gpu = 0
        # loaded by a prefetch and not requested since (tfscache.cache.prefetch)
        self.prefetched = False
        self.retried = False  # loading again after the node ran out of memory on a first try
        self.tier = tier  # where it is resident (tfscache.cache.tiers): GPU or HOST
        self.moving: str | None = None  # the tier it is moving to (demoted or promoted), if any
        self.load_s = 0.0  # seconds its last cold load took (0: adopted, not measured)
        self.away = False  # moving to another node, which holds it now: unloaded once idle

    @property
    def gpu_held(self) -> int:
        """The GPU bytes it counts against the GPU cap: on the GPU tier, or moving to or from it."""
        return self.gpu if self.tier == GPU or self.moving is not None else 0


class HandOff(asyncio.Future):
    """What a version handed over from a node of the other tier waits on (tfscache.cache.across):
    a waiter that is no request (the tier rules do not count it) and that does not wait for
    room."""


class Pending:
    """A cold model version waiting for its turn to load."""

    __slots__ = (
        "key",
        "estimate",
        "disk",
        "first_seen",
        "waiters",
        "blocked_since",
        "prefetch",
        "after",
        "room",
    )

    def __init__(self, key: Key, estimate: int, disk: int, now: float) -> None:
        self.key = key
        self.estimate = estimate
        self.disk = disk
        self.first_seen = now
        self.waiters: list[asyncio.Future] = []
        self.blocked_since: float | None = None  # monotonic; set while it waits for room
        # a prefetch (loads with idle room) and its predecessor
        self.prefetch, self.after = False, None
        # bytes of idle versions to unload before it loads, caps or not: set when its first
        # load ran the node out of memory (``retry_load``)
        self.room = 0

    def live(self) -> list[asyncio.Future]:
        """The waiters whose callers still wait."""
        return [w for w in self.waiters if not w.done()]


class Ledger:
    """Resident entries, pending loads, pins, recent load failures and learned sizes of one node.

    The only owner of this state: every change is a method named for what happened, and no
    other module assigns a field of the ledger, an ``Entry`` or a ``Pending``
    (tests/test_import_graph.py checks). The policy, if given, is told here and nowhere
    else: ``record_load`` when an entry turns READY (``loaded``, ``adopted``),
    ``record_access`` when one is leased (``leased``, ``accessed``), ``forget`` when one stops
    being resident (``retire``, ``lost``, ``reset``).

    The lifecycle: ``requested`` (a cold version joins ``pending``) -> ``admitted`` (LOADING)
    -> ``loaded`` (READY) or ``failed`` (gone, with a backoff) -> ``retire`` (UNLOADING) ->
    ``unloaded`` (gone, its pin with it). ``lost``: the node no longer serves the version
    (it restarted): the entry goes, its pin survives (the cache loads and pins it again).
    """

    def __init__(self, policy: EvictionPolicy | None = None, tier: str = GPU) -> None:
        self.tier = tier  # the tier its node's versions are on as they load (docs/tiers.md)
        self.entries: dict[Key, Entry] = {}
        self.pending: dict[Key, Pending] = {}
        # may name a version not in ``entries``: lost, being loaded again
        self.pinned: set[Key] = set()
        # bytes measured on an earlier load, kept across evictions
        self.learned: dict[Key, int] = {}
        self.learned_gpu: dict[Key, int] = {}  # GPU bytes measured on an earlier load, likewise
        self.promoted_s: dict[Key, float] = {}  # seconds of the last promotion from host memory
        self._failed: dict[Key, tuple[float, errors.TfscacheError]] = {}
        self._freeing: list[Freeing] = []  # gone from the node, memory not measured free yet
        # READY keys' requests in flight in workers, as last reported
        self.elsewhere: dict[Key, int] = {}
        self._policy = policy

    def __len__(self) -> int:
        return len(self.entries)

    # -- reads -----------------------------------------------------------------------------

    def used(self) -> int:
        """Bytes of every entry, leaving ones included (they count until gone)."""
        return sum(e.bytes for e in self.entries.values())

    def gpu_used(self) -> int:
        """GPU bytes of every entry on the GPU tier or moving, leaving ones included."""
        return sum(e.gpu_held for e in self.entries.values())

    def freeing(self) -> list[Freeing]:
        """Versions the node reported gone whose memory still counts (tfscache.cache.freeing)."""
        return list(self._freeing)

    def freeing_bytes(self) -> tuple[int, int]:
        """(host, GPU) bytes of versions gone whose memory the node has not given back yet."""
        return sum(f.bytes for f in self._freeing), sum(f.gpu for f in self._freeing)

    def gpu_estimate(self, key: Key) -> int:
        """GPU bytes ``key`` will take: learned on an earlier load, else 0 (unknown until it loads once)."""
        return self.learned_gpu.get(key, 0)

    def typical_size(self) -> int:
        """The median of the sizes learned on this node (0 before any): a floor for a model whose
        size on disk says nothing of its memory (a Python-backend model allocates at start-up)."""
        sizes = sorted(self.learned.values())
        return sizes[len(sizes) // 2] if sizes else 0

    def state_of(self, key: Key) -> str | None:
        """What the node does with that version: ``LOADING`` (admitted: being downloaded or
        loaded), ``READY`` or ``UNLOADING``; None otherwise. The disk tier keeps a version's files
        while this is not None (a version only queued does not count: it is fetched again when
        admitted, and holding the files of every queued version would fill a tier sized for what
        the nodes hold)."""
        entry = self.entries.get(key)
        return entry.state if entry is not None else None

    def wanted(self, *, loading: bool = True) -> list[Key]:
        """What the node should serve: every entry not leaving (nor LOADING ones if ``loading`` is
        False)."""
        return [k for k, e in self.entries.items()
                if e.state == READY or (loading and e.state == LOADING)]

    def ready(self, key: Key) -> Entry | None:
        """The entry if it is AVAILABLE (leases may be taken), else None."""
        entry = self.entries.get(key)
        return entry if entry is not None and entry.state == READY else None

    def held(self, key: Key) -> bool:
        """Whether ``key`` is AVAILABLE here and to be routed here (not away to another node)."""
        entry = self.entries.get(key)
        return entry is not None and entry.state == READY and not entry.away

    def handed_off(self, key: Key) -> None:
        """``key``, moving to another node, is held there now: away from here (module
        docstring)."""
        self.entries[key].away = True

    def away(self) -> list[Key]:
        """Versions away to another node that are idle now: to be unloaded."""
        return [k for k, e in self.entries.items()
                if e.away and e.state == READY and e.leases == 0 and k not in self.elsewhere]

    def idle(self) -> list[Key]:
        """READY entries with no lease, no pin, none in flight in a worker, not moving between
        tiers: the policy's victims to choose from."""
        return [
            k
            for k, e in self.entries.items()
            if e.state == READY
            and e.leases == 0
            and e.moving is None
            and k not in self.pinned
            and k not in self.elsewhere
        ]

    def queue(self) -> list[Pending]:
        """Pending loads not already in the config, most waiting requests first, then oldest
        (a prefetch no request has joined is not among them: ``prefetches``)."""
        return sorted(
            (
                p
                for p in self.pending.values()
                if p.key not in self.entries and not (p.prefetch and not p.live())
            ),
            key=lambda p: (-len(p.live()), p.first_seen),
        )

    def prefetches(self) -> list[Pending]:
        """Prefetches no request has joined yet, oldest first."""
        return sorted(
            (
                p
                for p in self.pending.values()
                if p.prefetch and not p.live() and p.key not in self.entries
            ),
            key=lambda p: p.first_seen,
        )

    def failure(self, key: Key, now: float) -> errors.TfscacheError | None:
        """The recorded failure of ``key`` while it lasts (an expired one is forgotten)."""
        failed = self._failed.get(key)
        if failed is None:
            return None
        if now < failed[0]:
            return failed[1]
        del self._failed[key]
        return None

    # -- requests and leases ---------------------------------------------------------------

    def requested(
        self, key: Key, waiter, estimate: int = 0, disk: int = 0, now: float = 0.0
    ) -> bool:
        """A request waits for cold ``key``: it joins the load in flight (a LOADING entry), or the
        pending load of ``key``, made with ``estimate``/``disk`` bytes at monotonic ``now`` if none.
        True when it joined a pending load (the reloader has work)."""
        entry = self.entries.get(key)
        if entry is not None and entry.state == LOADING:
            entry.waiters.append(waiter)
            return False
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = Pending(key, estimate, disk, now)
        pending.waiters.append(waiter)
        return True

    def prefetch(self, key: Key, estimate: int, disk: int, now: float, after: Key | None) -> bool:
        """A prefetch of cold ``key`` (``estimate``/``disk`` bytes), the likely follower of ``after``; False
        when it is already in the config or queued, or its last load failed within the backoff."""
        if key in self.entries or key in self.pending or self.failure(key, now) is not None:
            return False
        pending = self.pending[key] = Pending(key, estimate, disk, now)
        pending.prefetch, pending.after = True, after
        return True

    def drop_prefetches(self, before: float) -> None:
        """Forget prefetches still queued that were asked for before monotonic ``before`` (stale),
        unless their predecessor still waits for its own load or is loading: they go beside it."""
        for p in self.prefetches():
            if p.first_seen < before and not (
                p.after in self.pending or self.state_of(p.after) == LOADING
            ):
                del self.pending[p.key]

    def first_use(self, key: Key) -> bool:
        """A request takes ``key``: True if it was prefetched and this is its first request since."""
        entry = self.entries.get(key)
        if entry is None or not entry.prefetched:
            return False
        entry.prefetched = False
        return True

    def leased(self, key: Key, now_wall: float, now: float) -> Entry:
        """A request takes a lease on READY ``key`` (wall-clock ``now_wall``, monotonic ``now``)."""
        entry = self.entries[key]
        entry.leases += 1
        entry.last_use = now_wall
        self.accessed(key, now)
        return entry

    def accessed(self, key: Key, now: float) -> None:
        """A request used resident ``key`` (the simulator's hits take no lease)."""
        if self._policy is not None:
            self._policy.record_access(key, now)

    def in_flight_elsewhere(self, key: Key, count: int) -> None:
        """Worker processes (tfscache.workers) run ``count`` requests on ``key`` now: no victim while > 0."""
        if count > 0 and key in self.entries:
            self.elsewhere[key] = count
        else:
            self.elsewhere.pop(key, None)

    def released(self, key: Key) -> Entry | None:
        """A lease on ``key`` ended; the entry, or None if it is gone."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.leases -= 1
        return entry

    def pin(self, key: Key) -> None:
        """Never choose ``key`` as a victim (an admin pin)."""
        self.pinned.add(key)

    def unpin(self, keys) -> None:
        self.pinned.difference_update(keys)

    # -- what the reloader decided or the node did ---------------------------------------

    def blocked(self, key: Key, now: float) -> None:
        """Pending ``key`` waits for room under the caps (since monotonic ``now``, if not already)."""
        pending = self.pending[key]
        if pending.blocked_since is None:
            pending.blocked_since = now

    def gave_up(self, key: Key) -> Pending:
        """Pending ``key`` waited too long for room: it leaves, with its waiters (to be failed)."""
        return self.pending.pop(key)

    def drop_abandoned(self) -> None:
        """Forget pending loads whose callers all gave up."""
        for key, pending in list(self.pending.items()):
            if not pending.live() and not pending.prefetch:
                del self.pending[key]

    def admitted(self, key: Key, now_wall: float) -> Entry:
        """Turn pending ``key`` into a LOADING entry that takes over its waiters."""
        pending = self.pending.pop(key)
        entry = Entry(key, LOADING, pending.estimate, key in self.learned, now_wall,
                      disk=pending.disk, tier=self.tier)
        entry.waiters = pending.live()
        entry.gpu = self.gpu_estimate(key)
        entry.prefetched = pending.prefetch and not entry.waiters
        entry.retried = pending.room > 0
        self.entries[key] = entry
        return entry

    def measured(self, key: Key, size: int) -> None:
        """``key`` takes ``size`` bytes, measured across its load; remembered across evictions."""
        entry = self.entries[key]
        entry.bytes = size
        entry.measured = True
        self.learned[key] = size

    def learn(self, key: Key, size: int) -> None:
        """``key`` took ``size`` bytes on an earlier load (the state file remembers it)."""
        self.learned[key] = size

    def learn_gpu(self, key: Key, size: int) -> None:
        """``key``'s load grew its node's GPU memory by ``size`` bytes
        (tfscache.cache.planner.share_growth)."""
        self.learned_gpu[key] = size
        entry = self.entries.get(key)
        if entry is not None:
            entry.gpu = size

    def loaded(self, key: Key, load_s: float, now: float) -> list[asyncio.Future]:
        """``key`` is AVAILABLE after ``load_s`` s; its waiters, taken from it (each gets a lease)."""
        entry = self.entries[key]
        entry.state, entry.load_s = READY, load_s
        if self._policy is not None:
            self._policy.record_load(key, entry.bytes, load_s, now)
        waiters, entry.waiters = entry.waiters, []
        return waiters

    def failed(
        self, key: Key, error: errors.TfscacheError, until: float | None
    ) -> list[asyncio.Future]:
        """Loading ``key`` failed: it leaves, and requests get ``error`` until monotonic ``until``
        (None: no backoff). Its waiters, taken from it (to be failed)."""
        entry = self.entries.pop(key, None)
        if until is not None:
            self._failed[key] = (until, error)
        return _take_waiters(entry)

    def adopted(
        self, key: Key, size: int, measured: bool, last_use: float, now: float, pinned: bool
    ) -> None:
        """The node still serves ``key`` from before a restart (the state file): READY again."""
        self.entries[key] = Entry(key, READY, size, measured, last_use, tier=self.tier)
        if self._policy is not None:
            self._policy.record_load(key, size, 0.0, now)
        if pinned:
            self.pinned.add(key)

    def grew(self, key: Key, size: int) -> None:
        """The node ran out of memory with ``key``: it is taken to need ``size`` bytes from now
        on (resident, it counts them at once; remembered across evictions)."""
        self.learned[key] = size
        entry = self.entries.get(key)
        if entry is not None and entry.state != UNLOADING:
            entry.bytes = size

    def retry_load(self, key: Key, size: int, now: float) -> Pending:
        """LOADING ``key`` failed for want of memory: it waits again, with its waiters, to load
        once ``size`` bytes of idle versions are unloaded (``Pending.room``) and counting
        ``size`` bytes."""
        entry = self.entries.pop(key)
        self.learned[key] = size
        pending = self.pending[key] = Pending(key, size, entry.disk, now)
        pending.waiters, pending.room = entry.waiters, size
        entry.waiters = []
        return pending

    def on_tier(self, tier: str) -> list[Key]:
        """The resident (READY) keys on ``tier``, moving ones included (by the tier they leave)."""
        return [k for k, e in self.entries.items() if e.state == READY and e.tier == tier]

    def moving_to(self, key: Key, tier: str) -> None:
        """READY ``key`` starts moving to ``tier`` (demoted to HOST, promoted to GPU): it keeps
        answering, is no victim, and counts against both tiers until ``moved``."""
        if tier not in (GPU, HOST):
            raise ValueError(f"no tier {tier!r}")
        self.entries[key].moving = tier

    def moved(self, key: Key, seconds: float) -> None:
        """``key`` is on the tier it was moving to (after ``seconds``); a promotion's seconds are
        remembered (``promote_s``)."""
        entry = self.entries.get(key)
        if entry is None or entry.moving is None:
            return
        if entry.moving == GPU:
            self.promoted_s[key] = seconds
        entry.tier, entry.moving = entry.moving, None

    def move_failed(self, key: Key) -> None:
        """Moving ``key`` failed: it stays on the tier it was on."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.moving, entry.away = None, False

    def retire(self, key: Key) -> list[asyncio.Future]:
        """``key`` leaves the node's config (evicted: capacity, admin, drain, vanished): UNLOADING,
        counted until ``unloaded``. Its waiters, taken from it (to be failed)."""
        entry = self.entries[key]
        self._forget(entry)
        entry.state = UNLOADING
        return _take_waiters(entry)

    def unloaded(self, key: Key) -> Entry | None:
        """The node reported ``key`` gone after it was retired; its pin goes with it."""
        self.pinned.discard(key)
        entry = self.entries.pop(key, None)
        if entry is not None:
            self._forget(entry)
        return entry

    def free_later(self, record: Freeing) -> None:
        """Versions just ``unloaded`` keep counting (``record.bytes``, ``record.gpu``) until ``freed``."""
        if record.bytes or record.gpu:
            self._freeing.append(record)

    def freed(
        self, host_now: int | None, gpu_now: int | None, now: float
    ) -> tuple[list[Freeing], list[Freeing]]:
        """Release the records whose memory the node's measure shows given back, and those whose
        bounded wait passed: (measured free, counted free by the wait)."""
        measured = [f for f in self._freeing if f.dropped(host_now, gpu_now)]
        expired = [f for f in self._freeing if f not in measured and now >= f.until]
        self._freeing = [f for f in self._freeing if f not in measured and f not in expired]
        return measured, expired

    def lost(self, key: Key) -> Entry | None:
        """The node no longer serves ``key`` (it restarted, or a load's outcome is unknown after it
        failed): the entry leaves, but its pin SURVIVES, so the cache loads and pins it again
        (``Recovery.lost``; docs/state.md). Both recovery paths, ``recover`` and ``resync``,
        come here."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self._forget(entry)
        return entry

    def reset(self) -> None:
        """Forget every entry, pin and version being freed (start-up re-adoption starting over)."""
        for entry in self.entries.values():
            self._forget(entry)
        self.entries.clear()
        self.pinned.clear()
        self._freeing.clear()

    def take_waiters(self) -> list[asyncio.Future]:
        """Every waiting caller (pending loads dropped): the node is down or the cache stopped."""
        waiters = [w for p in self.pending.values() for w in p.waiters]
        self.pending.clear()
        for entry in self.entries.values():
            waiters += _take_waiters(entry)
        return waiters

    def _forget(self, entry: Entry) -> None:
        # a retired one was forgotten then
        if self._policy is not None and entry.state != UNLOADING:
            self._policy.forget(entry.key)


def _take_waiters(entry: Entry | None) -> list[asyncio.Future]:
    if entry is None:
        return []
    waiters, entry.waiters = entry.waiters, []
    return waiters


@dataclass(frozen=True)
class ResidentModel:
    """One entry of ``CacheManager.snapshot()``."""

    name: str
    version: int
    bytes: int
    measured: bool
    leases: int
    last_use: float  # wall-clock seconds
    state: str  # "loading", "available" or "unloading"
    pinned: bool = False  # never chosen as a victim (``CacheManager.pin``)
    tier: str = GPU  # "gpu" or "host" (docs/tiers.md)
    moving: str = ""  # the tier it is moving to, "" when it is not moving


@dataclass(frozen=True)
class QueuedLoad:
    """One entry of ``CacheManager.queue()``."""

    name: str
    version: int
    waiters: int
    bytes: int
    waiting_for_room: bool
