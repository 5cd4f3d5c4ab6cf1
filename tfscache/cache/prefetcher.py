"""The prefetch hook of one node's cache: learn from each request, queue its likely cold followers.

``CacheManager`` calls ``after(key)`` on every acquire, warm or cold (in the request's task, no
await). The learner (``tfscache.cache.prefetch.CoAccess``, pure) hears the request; each likely
follower neither resident nor queued gets its size estimated in a worker thread (a walk of its
version directory, as a cold request's) and is queued in the ledger as a prefetch
(``Ledger.prefetch``). The reloader loads it only with idle room (``planner.plan_prefetch``).
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

    def after(self, key: Key) -> None:
        """A request for ``key`` now: learn from it, and queue its likely cold followers."""
        self._learner.observe(key, time.monotonic())
        ledger = self._ledger
        for follower in self._learner.followers(key)[:self._followers]:
            if follower not in ledger.entries and follower not in ledger.pending:
                self._tasks.add(task := asyncio.create_task(self._queue(follower)))
                task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _queue(self, key: Key) -> None:
        try:
            sizes = await asyncio.to_thread(self._estimate, key)
        except errors.TfscacheError:  # gone from the repository, or larger than the cap: no prefetch
            return
        sig = self._signals
        if sig.healthy and not (sig.closed or sig.draining) and self._ledger.prefetch(key, *sizes, time.monotonic()):
            sig.wake()
