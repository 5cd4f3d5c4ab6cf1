"""GreedyDual-Size-Frequency with a decayed, remembered frequency: evict the model worth least per byte.

A model's worth is ``F * C / R``:

* ``C``: the seconds its latest measured load took (what evicting it costs when it comes
  back); before any measurement, the mean of those measured so far (1 s before any);
* ``R``: the room it holds: its measured bytes as a share of the memory cap; under a count
  cap alone, one slot; with both caps, the larger share (as ``cost``); with no cap known,
  its bytes. Unmeasured: the mean size measured so far (1 byte before any);
* ``F``: its requests, each weighing ``2 ** (-age / halflife)`` where ``age`` counts the
  requests the policy has seen since (per node: each node has its own policy). The count
  is *remembered across evictions* (for at most ``history`` models not resident, the
  least recently requested forgotten first), so a steadily popular model comes back with
  its history instead of starting again from one request. A model that stops being
  requested (a daily shift) loses half its weight every ``halflife`` requests. A model loaded
  and not yet requested (re-adopted at start-up) has ``F`` = 0 and goes first.

The idle model with the lowest worth *now* goes first. Every ``F`` decays by the same factor
per request, so that order never changes between requests, and a heap keyed at each
request by

    H = L + log2(F * C / R),   L = requests seen / halflife

keeps it: ``H`` is ``log2`` of the worth scaled by ``2 ** L``, a factor common to all. This
is GreedyDual's inflation value made multiplicative: ``L`` only grows, a request sets a
model's ``H`` from the ``L`` of that moment (recency), and a model not requested again
falls behind every model that is (Cao & Irani's GreedyDual-Size; Cherkasova's GDSF adds
``F``; the exponential weighting of past requests is LRFU's, Lee et al. 2001).

Why this member of the family, measured (docs/policy.md, scripts/bench_policy.py): GDSF with
the additive inflation ``L`` = the last evicted priority and counts since the load only is
the ``cost`` policy; remembering decayed counts across evictions spends 5-10 % fewer load
seconds than it under memory caps on stationary Zipf and pipeline logs (0-13 % on a log
whose popularity is reshuffled daily), and comes within 3 % of a cache told every model's
popularity in advance at 8 GiB per node. ``halflife`` trades stable logs (longer is better) against
shifts (shorter).

Cost: ``record_access`` is O(log n) (a push on a heap with lazy deletion; stale entries
are skipped, or swept when they outnumber the live ones); ``victims`` sorts the m
candidates (O(m log m)); ``next_victim`` is O(log n) amortised.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from tfscache.cache.policy import EvictionPolicy, Key
from tfscache.cache.policy.heaporder import HeapOrdered


class GDSFPolicy(HeapOrdered, EvictionPolicy):
    """Evict the lowest decayed ``F * C / R`` (heap keyed by ``L + log2(F * C / R)``)."""

    name = "gdsf"

    def __init__(self, max_models: int = 0, memory_bytes: int = 0, halflife: float = 2_000,
                 history: int = 100_000) -> None:
        if not halflife > 0 or history < 0:
            raise ValueError(
                f"halflife must be > 0 and history >= 0, got halflife={halflife!r}, history={history!r}"
            )
        self.halflife, self.history = float(halflife), history
        self._clock = 0  # requests seen: L = clock / halflife
        self._init_order()  # resident key -> (H, sequence number)
        # key -> (F, clock when F was set)
        self._freq: OrderedDict[Key, tuple[float, int]] = OrderedDict()
        # kept after an eviction: a model comes back priced by its own load
        self._cost: dict[Key, float] = {}
        self._size: dict[Key, int] = {}
        self._cost_sum = self._size_sum = 0.0
        self._cost_n = self._size_n = 0
        self.max_models = self.memory_bytes = 0
        self.set_caps(max_models, memory_bytes)

    @classmethod
    def from_settings(cls, section: Any) -> GDSFPolicy:
        return cls(halflife=section.policy_halflife_requests)

    def set_caps(self, max_models: int, memory_bytes: int) -> None:
        """The node's caps (0: none), which decide the room a model holds; re-prices every model (O(n))."""
        if max_models < 0 or memory_bytes < 0:
            raise ValueError(
                f"caps must not be negative, got max_models={max_models}, memory_bytes={memory_bytes}"
            )
        self.max_models, self.memory_bytes = max_models, memory_bytes
        for key in list(self._prio):
            self._set(key)

    # -- EvictionPolicy ------------------------------------------------------------------

    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        if load_seconds > 0:
            self._cost[key] = load_seconds
            self._cost_sum += load_seconds
            self._cost_n += 1
        if size_bytes > 0:
            self._size[key] = size_bytes
            self._size_sum += size_bytes
            self._size_n += 1
        self._set(key)

    def record_access(self, key: Key, now: float) -> None:
        self._clock += 1
        self._freq[key] = (self.frequency(key) + 1.0, self._clock)
        self._freq.move_to_end(key)
        self._set(key)

    def forget(self, key: Key) -> None:
        self._prio.pop(key, None)
        if key not in self._freq:  # never requested: nothing to remember it by
            self._drop(key)
        while len(self._freq) > self.history + len(self._prio):
            old, entry = self._freq.popitem(last=False)
            if old in self._prio:  # resident: keep its count, at the recent end
                self._freq[old] = entry
            else:
                self._drop(old)

    def frequency(self, key: Key) -> float:
        """``key``'s decayed request count now (0 for a key never requested, or forgotten)."""
        count, when = self._freq.get(key, (0.0, self._clock))
        return (
            count * math.exp2((when - self._clock) / self.halflife)
            if when != self._clock
            else count
        )

    def worth(self, key: Key) -> float:
        """``F * C / R`` now (0 for a model never requested: it goes first, as a key no policy saw)."""
        cost = self._cost.get(key) or (self._cost_sum / self._cost_n if self._cost_n else 1.0)
        return self.frequency(key) * cost / self.room(key)

    def room(self, key: Key) -> float:
        """The share of the caps ``key`` holds (its bytes while no cap is known)."""
        size = self._size.get(key) or (self._size_sum / self._size_n if self._size_n else 1.0)
        if self.memory_bytes:
            share = size / self.memory_bytes
            return max(share, 1.0 / self.max_models) if self.max_models else share
        return 1.0 / self.max_models if self.max_models else size

    def colder_than(self, candidates, key: Key, now: float) -> list[Key]:
        """The candidates whose ``H`` is below the one ``key`` would get from a request now
        (its remembered frequency plus that request, its own or the mean cost and size)."""
        cost = self._cost.get(key) or (self._cost_sum / self._cost_n if self._cost_n else 1.0)
        worth = (self.frequency(key) * self._decay_one() + 1.0) * cost / self.room(key)
        bar = (self._clock + 1) / self.halflife + math.log2(worth)
        return [
            k for k in self.victims(candidates, now) if self._prio.get(k, (float("-inf"),))[0] < bar
        ]

    def _decay_one(self) -> float:
        return math.exp2(-1.0 / self.halflife)

    # -- internals -----------------------------------------------------------------------

    def _drop(self, key: Key) -> None:
        self._cost.pop(key, None)
        self._size.pop(key, None)

    def _set(self, key: Key) -> None:
        worth = self.worth(key)
        self._push(
            key, self._clock / self.halflife + (math.log2(worth) if worth > 0 else float("-inf"))
        )
