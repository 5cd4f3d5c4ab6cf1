"""Least recently used: evict the idle model whose last use (or load) is oldest."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tfscache.cache.policy import EvictionPolicy, Key


class LRUPolicy(EvictionPolicy):
    """Recency order in an OrderedDict: oldest first, moved to the end on each use."""

    name = "lru"

    def __init__(self) -> None:
        self._last_use: OrderedDict[Key, float] = OrderedDict()

    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        if key not in self._last_use:
            self._last_use[key] = now

    def record_access(self, key: Key, now: float) -> None:
        self._last_use[key] = now
        self._last_use.move_to_end(key)

    def forget(self, key: Key) -> None:
        self._last_use.pop(key, None)

    def victims(self, candidates: Iterable[Key], now: float) -> Iterable[Key]:
        wanted = set(candidates)
        # Walk recency order; keys never recorded (should not happen) go first.
        unknown = [key for key in wanted if key not in self._last_use]
        return unknown + [key for key in self._last_use if key in wanted]

    def colder_than(self, candidates: Iterable[Key], key: Key, now: float) -> list[Key]:
        """Every candidate: each was last used before ``now``, when ``key`` would be."""
        return list(self.victims(candidates, now))

    def next_victim(self, now: float) -> Key | None:
        """The least recently used tracked key (O(1)); the simulator's fast path."""
        return next(iter(self._last_use), None)
