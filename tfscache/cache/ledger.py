"""The ledger of one node's cache: what is resident, what waits to load, leases, pins, failures, sizes.

Plain bookkeeping with no I/O and no asyncio beyond holding the futures of waiting
requests: the manager records acquires and releases here, the planner reads it, the
reloader records what the node did. ``Key`` is ``(model name, version)``.

An ``Entry`` is a version in the node's config: LOADING (sent, not yet AVAILABLE),
READY (AVAILABLE; leases may be taken) or UNLOADING (left the config; counts against
the caps until the node reports it gone). A ``Pending`` is a cold version that
requests wait for and the planner has not admitted yet.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tfscache import errors

Key = tuple[str, int]

LOADING, READY, UNLOADING = "loading", "available", "unloading"


class Entry:
    """A model version in the node's config (or leaving it)."""

    __slots__ = ("key", "state", "bytes", "disk", "measured", "leases", "last_use", "waiters", "gpu")

    def __init__(self, key: Key, state: str, size: int, measured: bool, last_use: float,
                 disk: int = 0) -> None:
        self.key = key
        self.disk = disk
        self.state = state
        self.bytes = size
        self.measured = measured
        self.leases = 0
        self.last_use = last_use  # wall-clock seconds
        self.waiters: list[asyncio.Future] = []
        self.gpu = 0  # GPU bytes: learned from the growth across a load (tfscache.kinds.gpumem); 0 = none known


class Pending:
    """A cold model version waiting for its turn to load."""

    __slots__ = ("key", "estimate", "disk", "first_seen", "waiters", "blocked_since")

    def __init__(self, key: Key, estimate: int, disk: int, now: float) -> None:
        self.key = key
        self.estimate = estimate
        self.disk = disk
        self.first_seen = now
        self.waiters: list[asyncio.Future] = []
        self.blocked_since: float | None = None  # monotonic; set while it waits for room

    def live(self) -> list[asyncio.Future]:
        """The waiters whose callers still wait."""
        return [w for w in self.waiters if not w.done()]


class Ledger:
    """Resident entries, pending loads, pins, recent load failures and learned sizes of one node."""

    def __init__(self) -> None:
        self.entries: dict[Key, Entry] = {}
        self.pending: dict[Key, Pending] = {}
        self.pinned: set[Key] = set()
        self.learned: dict[Key, int] = {}  # bytes measured on an earlier load, kept across evictions
        self.learned_gpu: dict[Key, int] = {}  # GPU bytes measured on an earlier load, likewise
        self._failed: dict[Key, tuple[float, errors.TfscacheError]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def use_of(self, key: Key) -> str | None:
        """What the node does with that version's files: ``LOADING`` (admitted: being downloaded or
        loaded), ``READY`` or ``UNLOADING``; None otherwise (they may go). A version only queued
        (pending) does not count: it is fetched again when admitted, and holding the files of every
        queued version would fill a disk tier sized for what the nodes hold."""
        entry = self.entries.get(key)
        return entry.state if entry is not None else None

    def used(self) -> int:
        """Bytes of every entry, leaving ones included (they count until gone)."""
        return sum(e.bytes for e in self.entries.values())

    def gpu_used(self) -> int:
        """GPU bytes of every entry, leaving ones included."""
        return sum(e.gpu for e in self.entries.values())

    def gpu_estimate(self, key: Key) -> int:
        """GPU bytes ``key`` will take: learned on an earlier load, else 0 (unknown until it loads once)."""
        return self.learned_gpu.get(key, 0)

    def learn_gpu(self, key: Key, size: int) -> None:
        """``key``'s load grew its node's GPU memory by ``size`` bytes (tfscache.cache.planner.share_growth)."""
        self.learned_gpu[key] = size
        entry = self.entries.get(key)
        if entry is not None:
            entry.gpu = size

    def typical_size(self) -> int:
        """The median of the sizes learned on this node (0 before any): a floor for a model whose
        size on disk says nothing of its memory (a Python-backend model allocates at start-up)."""
        sizes = sorted(self.learned.values())
        return sizes[len(sizes) // 2] if sizes else 0

    def state_of(self, key: Key) -> str | None:
        entry = self.entries.get(key)
        return entry.state if entry is not None else None

    def ready(self, key: Key) -> Entry | None:
        """The entry if it is AVAILABLE (leases may be taken), else None."""
        entry = self.entries.get(key)
        return entry if entry is not None and entry.state == READY else None

    def idle(self) -> list[Key]:
        """READY entries with no lease and no pin: what the policy may choose victims from."""
        return [k for k, e in self.entries.items() if e.state == READY and e.leases == 0 and k not in self.pinned]

    def queue(self) -> list[Pending]:
        """Pending loads not already in the config, most waiting requests first, then oldest."""
        return sorted((p for p in self.pending.values() if p.key not in self.entries),
                      key=lambda p: (-len(p.live()), p.first_seen))

    def drop_abandoned(self) -> None:
        """Forget pending loads whose callers all gave up."""
        for key, pending in list(self.pending.items()):
            if not pending.live():
                del self.pending[key]

    def admit(self, key: Key, now_wall: float) -> Entry:
        """Turn pending ``key`` into a LOADING entry that takes over its waiters."""
        pending = self.pending.pop(key)
        entry = Entry(key, LOADING, pending.estimate, key in self.learned, now_wall, disk=pending.disk)
        entry.waiters = pending.live()
        entry.gpu = self.gpu_estimate(key)
        self.entries[key] = entry
        return entry

    def remove(self, key: Key) -> Entry | None:
        """The entry leaves the ledger (gone from the node); its pin goes with it."""
        self.pinned.discard(key)
        return self.entries.pop(key, None)

    def record_failure(self, key: Key, until: float, error: errors.TfscacheError) -> None:
        """``key``'s load failed: requests get ``error`` until monotonic time ``until``."""
        self._failed[key] = (until, error)

    def failure(self, key: Key, now: float) -> errors.TfscacheError | None:
        """The recorded failure of ``key`` while it lasts (an expired one is forgotten)."""
        failed = self._failed.get(key)
        if failed is None:
            return None
        if now < failed[0]:
            return failed[1]
        del self._failed[key]
        return None


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


@dataclass(frozen=True)
class QueuedLoad:
    """One entry of ``CacheManager.queue()``."""

    name: str
    version: int
    waiters: int
    bytes: int
    waiting_for_room: bool
