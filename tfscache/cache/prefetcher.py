"""The prefetch hook of one node's cache: learn from each request, queue its likely cold followers.

``CacheManager`` tells it of every request, in the request's task and without an await:

* a hit: ``after(key)``: the learner (``tfscache.cache.prefetch.CoAccess``, pure) hears it; each
  likely follower already resident is kept as warm as ``key`` (the policy hears it used), and
  each one neither resident nor queued gets its size estimated in a worker thread (a walk of its
  version directory, as a cold request's) and is queued in the ledger as a prefetch
  (``Ledger.prefetch``);
* a cold request: ``wanted(key)`` names its likely cold followers at once; the manager estimates
  them in the same trip off the loop as the request's own version, and ``queue``s them beside the
  request's load, so the reloader admits them in the same step (a pipeline's next stage loads
  while the first does: planner.plan_prefetch, the reloader's ``load``). The learner hears the
  request as it ``arrived`` and once ``answered``: a pipeline's next stage is sent when this one
  answers, so a pair's window starts at the answer, however long the load took.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tfscache import errors
from tfscache.cache.ledger import Key, Ledger
from tfscache.cache.prefetch import CoAccess, CoAccessSettings, PrefetchCounts
from tfscache.cache.signals import Signals


class Prefetcher:
    """One node's co-access prefetch (see the module docstring); ``counts`` are its loads' outcomes."""

    def __init__(self, ledger: Ledger, signals: Signals, estimate: Callable[[Key], tuple[int, int]],
                 settings) -> None:
        """``estimate(key)``: (bytes, bytes on disk), blocking; ``settings``: the cache section."""
        self.counts = PrefetchCounts()
        self._learner = CoAccess(CoAccessSettings.from_section(settings))
        self._followers = settings.prefetch_followers
        self._ledger, self._signals, self._estimate = ledger, signals, estimate
        self._tasks: set[asyncio.Task] = set()

    def cold(self, key: Key, sizes: dict[Key, tuple[int, int]] | None) -> None:
        """A cold request for ``key`` arrived now (it may follow a request answered just before):
        queue its likely followers, ``sizes`` (``wanted`` then ``estimates``; None: sized later)."""
        self._learner.arrived(key, time.monotonic())
        if sizes is None:
            self.later(key)
        else:
            self.queue(key, sizes)

    def answered(self, key: Key) -> None:
        """A cold request for ``key`` is served now: its followers are timed from now."""
        self._learner.answered(key, time.monotonic())

    def wanted(self, key: Key) -> list[Key]:
        """``key`` was just requested: its likely followers. Those resident are kept as warm as it
        (the policy hears them used now, before ``key`` itself); returned: those neither in the
        node's config nor queued, to prefetch."""
        ledger, now = self._ledger, time.monotonic()
        followers = self._learner.followers(key)[:self._followers]
        for follower in followers:
            if ledger.ready(follower) is not None:
                ledger.accessed(follower, now)
        return [f for f in followers if f not in ledger.entries and f not in ledger.pending]

    def after(self, key: Key) -> None:
        """A hit on ``key`` now: learn from it, and queue its likely cold followers (sized off the loop)."""
        self._learner.observe(key, time.monotonic())
        self.later(key)

    def later(self, key: Key) -> None:
        """Queue ``key``'s likely cold followers once sized off the loop."""
        for follower in self.wanted(key):
            self._tasks.add(task := asyncio.create_task(self._queue(key, follower)))
            task.add_done_callback(self._tasks.discard)

    def estimates(self, keys: list[Key]) -> dict[Key, tuple[int, int]]:
        """Blocking (a worker thread): the sizes of ``keys`` that can be prefetched (not gone, not
        over a cap)."""
        sizes = {}
        for key in keys:
            try:
                sizes[key] = self._estimate(key)
            # gone from the repository, or larger than the cap: no prefetch
            except errors.TfscacheError:
                pass
        return sizes

    def queue(self, after: Key, sizes: dict[Key, tuple[int, int]]) -> None:
        """Queue prefetches of ``sizes``' keys (estimated by ``estimates``), likely followers of
        ``after``, unless the node cannot take them."""
        sig, now = self._signals, time.monotonic()
        if not sig.healthy or sig.closed or sig.draining:
            return
        if sum(self._ledger.prefetch(key, *size, now, after) for key, size in sizes.items()):
            sig.wake()

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _queue(self, after: Key, key: Key) -> None:
        self.queue(after, await asyncio.to_thread(self.estimates, [key]))
