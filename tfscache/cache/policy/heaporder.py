"""Victims in priority order, lowest first: the bookkeeping LFU-DA and GDSF share.

A priority change pushes a new heap entry (O(log n)); the entry it replaces stays in the
heap, stale, and is skipped when it reaches the top, or swept once stale entries outnumber
live ones (amortised O(1)). ``victims()`` sorts the candidates by priority (O(m log m));
``next_victim()`` peeks the heap (for a simulator). Keys never given a priority sort first.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

Key = Hashable
UNKNOWN = (float("-inf"), -1)  # sorts before every real priority (value, sequence number, ...)


class HeapOrdered:
    """Mix into an ``EvictionPolicy``: call ``_init_order()`` in ``__init__`` and ``_push`` on each
    priority change; ``victims``, ``next_victim`` and ``priority`` follow the priorities pushed."""

    def _init_order(self) -> None:
        # key -> (priority, sequence number, *whatever the policy keeps); the sequence number breaks ties
        self._prio: dict[Key, tuple] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0

    def _push(self, key: Key, value: float, *extra) -> None:
        self._seq = seq = self._seq + 1
        self._prio[key] = (value, seq, *extra)
        heap = self._heap
        heapq.heappush(heap, (value, seq, key))
        if len(heap) > 2 * len(self._prio) + 64:  # sweep stale entries
            self._heap = [(p[0], p[1], k) for k, p in self._prio.items()]
            heapq.heapify(self._heap)

    def victims(self, candidates: Iterable[Key], now: float) -> list[Key]:
        prio = self._prio
        # sequence numbers are unique
        return sorted(set(candidates), key=lambda key: prio.get(key, UNKNOWN))

    def next_victim(self, now: float) -> Key | None:
        """The first of every key with a priority, in eviction order (O(log n) amortised); None when empty."""
        heap, prio = self._heap, self._prio
        while heap:
            _, seq, key = heap[0]
            current = prio.get(key)
            if current is not None and current[1] == seq:
                return key
            heapq.heappop(heap)  # stale: re-prioritised or forgotten since
        return None

    def priority(self, key: Key) -> float | None:
        """``key``'s current priority (None if it has none); for tests and status pages."""
        prio = self._prio.get(key)
        return None if prio is None else prio[0]
