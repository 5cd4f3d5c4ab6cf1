"""Cost-aware eviction: GreedyDual-Size-Frequency with the load time as the cost.

Each resident model has a priority

    H = L + F * C / R

* ``F``: uses since the model was loaded (as in LFU-DA, lfu.py);
* ``C``: seconds its last load took: what evicting it costs when it comes back;
* ``R``: the room it holds: the largest share of a cap it takes,
  ``max(1 / max_models, S / memory_bytes)`` for a model of ``S`` bytes (a cap of 0 is
  no cap). Under a memory cap alone this is GDSF's size (Cherkasova 1998); under a
  count cap alone every model holds one slot and size does not matter; with both,
  small models are priced by the slot and large ones by their bytes. Until the caps
  are given (constructor or ``set_caps``), ``R = S``: plain GDSF, right when memory binds;
* ``L``: the age, the priority of the last model evicted; a use sets ``H`` from the
  age of that moment, so a model that stops being used is passed by in time.

The idle model with the lowest ``H`` goes first: the one whose reload costs the least
per unit of room freed. Two models of one size and one use count: the slower to load
stays. Two of one load time: the more used stays; then (under a memory cap) the smaller.

A model re-adopted at start-up is recorded with a load time of 0 (unknown): it is
priced with the mean load time seen so far (1 s before any), and a size of 0 with the
mean size (1 byte before any), so nothing is evicted or kept for a missing
measurement. A new measurement of a resident model re-prices it at its old age.
"""

from __future__ import annotations

from tfscache.cache.policy import Key
from tfscache.cache.policy.lfu import LFUPolicy


class CostAwarePolicy(LFUPolicy):
    """GDSF: priority ``L + uses * load_seconds / room``; evict the lowest."""

    name = "cost"

    def __init__(self, max_models: int = 0, memory_bytes: int = 0) -> None:
        super().__init__()
        self._worth: dict[Key, float] = {}  # key -> C / R, fixed at each measurement
        self._cost: dict[Key, float] = {}  # 0.0: unknown
        self._size: dict[Key, int] = {}  # 0: unknown
        self._cost_total, self._cost_count = 0.0, 0
        self._size_total, self._size_count = 0, 0
        self.max_models = self.memory_bytes = 0
        self.set_caps(max_models, memory_bytes)

    def set_caps(self, max_models: int, memory_bytes: int) -> None:
        """The node's caps (0: none), which decide what room a model holds; re-prices every model (O(n))."""
        if max_models < 0 or memory_bytes < 0:
            raise ValueError(
                f"caps must not be negative, got max_models={max_models}, memory_bytes={memory_bytes}"
            )
        self.max_models, self.memory_bytes = max_models, memory_bytes
        for key, (_, _, uses, base) in list(self._prio.items()):
            self._price(key)
            self._set(key, uses, base)

    def _measured(self, key: Key, size_bytes: int, load_seconds: float) -> None:
        if load_seconds > 0:
            self._cost[key] = load_seconds
            self._cost_total += load_seconds
            self._cost_count += 1
        else:
            self._cost.setdefault(key, 0.0)
        if size_bytes > 0:
            self._size[key] = size_bytes
            self._size_total += size_bytes
            self._size_count += 1
        else:
            self._size.setdefault(key, 0)
        self._price(key)

    def _price(self, key: Key) -> None:
        cost = self._cost[key] or (self._cost_total / self._cost_count if self._cost_count else 1.0)
        self._worth[key] = cost / self.room(key)

    def room(self, key: Key) -> float:
        """The share of the caps ``key`` holds (its size in bytes while the caps are unknown)."""
        size = self._size.get(key) or (
            self._size_total / self._size_count if self._size_count else 1.0
        )
        if not (self.max_models or self.memory_bytes):
            return size
        slot = 1.0 / self.max_models if self.max_models else 0.0
        return max(slot, size / self.memory_bytes) if self.memory_bytes else slot

    def _value(self, key: Key, uses: int) -> float:
        worth = self._worth.get(key)
        if worth is None:  # used but never recorded as loaded: priced as an average model
            self._measured(key, 0, 0.0)
            worth = self._worth[key]
        return uses * worth

    def forget(self, key: Key) -> None:
        super().forget(key)
        self._worth.pop(key, None)
        self._cost.pop(key, None)
        self._size.pop(key, None)
