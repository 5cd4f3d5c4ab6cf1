"""Least frequently used with dynamic ageing (LFU-DA): frequency wins, but old fame fades.

Each resident model has a priority ``K = L + F``:

* ``F`` counts the model's uses since it was loaded (it starts again at 0 after an
  unload, so a model earns its place anew each time it comes back);
* ``L`` is the policy's age: the priority of the last model evicted. It never falls.
  A use sets ``K = L + F`` with the age of that moment.

The idle model with the lowest ``K`` goes first (ties: the one whose priority was set
longest ago, as LRU would). Without ``L`` this is plain LFU, where a model that was
hot an hour ago keeps its count for ever and can never leave; with it, every eviction
raises the bar that newcomers start from, so a model that stops being used is passed
by after about ``F`` evictions (Arlitt et al., "Evaluating content management
techniques for Web proxy caches", 2000). Ageing is counted in evictions, not in
seconds, so it needs no time scale and a replayed log behaves as a live one.

The cache manager reports an eviction by ``forget(key)``; it also forgets a model that
vanished from the repository or failed, and those rare cases raise ``L`` too (at worst
ageing the cache a little early). Keys the policy never saw are evicted first.

Bookkeeping is a heap with lazy deletion (``heaporder.HeapOrdered``, shared with gdsf).

``CostAwarePolicy`` (cost.py) is this policy with ``F`` weighted by load cost and size.
"""

from __future__ import annotations

from tfscache.cache.policy import EvictionPolicy, Key
from tfscache.cache.policy.heaporder import HeapOrdered


class LFUPolicy(HeapOrdered, EvictionPolicy):
    """LFU-DA: priority ``L + F``; evict the lowest; ``L`` becomes the evicted priority."""

    name = "lfu"

    def __init__(self) -> None:
        self.age = 0.0
        """``L``: the priority of the last model evicted (never decreases)."""
        self._init_order()  # key -> (K, sequence number, uses, L when K was set)

    # -- what a subclass may change ----------------------------------------------------

    def _value(self, key: Key, uses: int) -> float:
        """What ``key`` is worth above the age: here its use count."""
        return float(uses)

    def _measured(self, key: Key, size_bytes: int, load_seconds: float) -> None:
        """A load or a new measurement of ``key`` (ignored: frequency alone counts here)."""

    # -- EvictionPolicy ------------------------------------------------------------------

    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        self._measured(key, size_bytes, load_seconds)
        prio = self._prio.get(key)
        if prio is None:
            self._set(key, 0, self.age)
        else:  # a better measurement: same uses, same age, new value
            self._set(key, prio[2], prio[3])

    def record_access(self, key: Key, now: float) -> None:
        prio = self._prio.get(key)
        self._set(key, 1 if prio is None else prio[2] + 1, self.age)

    def forget(self, key: Key) -> None:
        prio = self._prio.pop(key, None)
        if prio is not None and prio[0] > self.age:
            self.age = prio[0]

    # -- internals -----------------------------------------------------------------------

    def _set(self, key: Key, uses: int, base: float) -> None:
        self._push(key, base + self._value(key, uses), uses, base)
