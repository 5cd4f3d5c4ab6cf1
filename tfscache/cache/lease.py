"""A lease: a request's hold on a resident model version; a leased version is never unloaded.

``Leases`` grants them and takes them back for one node's cache: the manager's hits and the
reloader's answers to the requests that waited for a load both take theirs from it, so neither
calls the other for one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tfscache.cache.ledger import Entry, Key, Ledger
from tfscache.cache.moves import TierMoves
from tfscache.cache.prefetch import PrefetchCounts
from tfscache.cache.signals import Signals


class Lease:
    """A hold on a resident model version; release it when the request is done."""

    __slots__ = ("name", "version", "_release", "_released", "prefetched", "started", "tier")

    def __init__(self, release: Callable[[Key, float | None, str | None], None], key: Key,
                 prefetched: bool = False, started: float | None = None,
                 tier: str | None = None) -> None:
        self.name, self.version = key
        self._release = release
        self._released = False
        self.started = started  # monotonic, when granted: timed only with demotion on
        self.tier = tier  # the tier it was granted on (timed: only if still there at release)
        # the first request of a version a prefetch loaded (docs/prefetch.md)
        self.prefetched = prefetched

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._release((self.name, self.version), self.started, self.tier)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, {self.version})"


class Leases:
    """The leases of one node's cache: each is recorded in the ledger when granted and when
    released; a release that frees what a load or the caps wait for wakes the reloader."""

    def __init__(self, ledger: Ledger, signals: Signals,
                 prefetched: PrefetchCounts | None = None, moves: TierMoves | None = None) -> None:
        """``prefetched``: the prefetch counts (prefetch on), told when a prefetched version is
        first used; ``moves``: with demotion on, told of each lease, timed (tfscache.cache.moves)."""
        self._ledger, self._signals, self._prefetched = ledger, signals, prefetched
        self._moves = moves
        self._idle: dict[Key, list[asyncio.Future]] = {}  # ``idle`` callers, by key

    def grant(self, entry: Entry, counted: bool = True) -> Lease:
        """A lease on READY ``entry``, taken now (no await between the READY check and this);
        ``counted`` False: no request's (a hand-off's, tfscache.cache.across), which the tier
        rules do not count."""
        now = time.monotonic()
        self._ledger.leased(entry.key, time.time(), now)
        first = self._ledger.first_use(entry.key)
        if first:
            self._prefetched.count("used")
        if self._moves is None or not counted:
            return Lease(self.release, entry.key, prefetched=first)
        if self._moves.granted(entry, now):
            self._signals.wake()  # its promotion pays now
        if entry.moving is not None:  # served across a move: it times neither tier
            return Lease(self.release, entry.key, prefetched=first)
        return Lease(self.release, entry.key, prefetched=first, started=now, tier=entry.tier)

    def release(self, key: Key, started: float | None = None, tier: str | None = None) -> None:
        entry = self._ledger.released(key)
        if entry is None:
            return
        if (started is not None and self._moves is not None and entry.moving is None
                and entry.tier == tier):  # a lease that saw a move times neither tier
            self._moves.released(key, tier, time.monotonic() - started)
        sig = self._signals
        if entry.leases == 0 and (self._ledger.pending or sig.draining or sig.over_cap
                                  or entry.away):
            sig.wake()  # a load may be waiting for room, or the caps for a victim
        if entry.leases == 0:
            for waiter in self._idle.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def idle(self, keys: list[Key], timeout: float) -> None:
        """Return once none of ``keys`` has a lease (or is gone), or after ``timeout`` s."""
        loop = asyncio.get_running_loop()
        waits = []
        for key in keys:
            entry = self._ledger.entries.get(key)
            if entry is not None and entry.leases:
                waits.append(loop.create_future())
                self._idle.setdefault(key, []).append(waits[-1])
        if not waits:
            return
        try:
            await asyncio.wait(waits, timeout=timeout)
        finally:
            for key in keys:
                left = [w for w in self._idle.get(key, ()) if w not in waits]
                if left:
                    self._idle[key] = left
                else:
                    self._idle.pop(key, None)
