"""First in, first out: evict the idle model that was loaded longest ago, however much it is used.

A baseline: it ignores every use after the load, so a hot model is unloaded as
readily as a cold one of the same age. Useful to measure what recency buys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tfscache.cache.policy import EvictionPolicy, Key


class FIFOPolicy(EvictionPolicy):
    """Load order in an OrderedDict; uses do not move a model."""

    name = "fifo"

    def __init__(self) -> None:
        self._loaded: OrderedDict[Key, None] = OrderedDict()

    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        # A new size measurement for a resident key keeps its place in the queue.
        if key not in self._loaded:
            self._loaded[key] = None

    def record_access(self, key: Key, now: float) -> None:
        if key not in self._loaded:  # never loaded as far as we know: it joins the queue now
            self._loaded[key] = None

    def forget(self, key: Key) -> None:
        self._loaded.pop(key, None)

    def victims(self, candidates: Iterable[Key], now: float) -> list[Key]:
        wanted = set(candidates)
        unknown = [key for key in wanted if key not in self._loaded]
        return unknown + [key for key in self._loaded if key in wanted]

    def next_victim(self, now: float) -> Key | None:
        """The first of every tracked key in eviction order (O(1)); None when empty."""
        return next(iter(self._loaded), None)
