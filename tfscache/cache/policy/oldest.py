"""Oldest last inference, else fewest requests over a window (seed 001's policy).

The idle candidates go in this order:

1. keys the policy never saw (nothing to keep them for);
2. *cold* models, with no request in the last ``window_s`` seconds: the oldest last
   inference first (LRU among them);
3. *warm* models, used within the window: the fewest requests in the window first;
   equal counts, the oldest last inference first.

So "oldest last inference" decides while there is a model idle for a whole window, and
"else fewest requests over the window" decides when every candidate was used within it.
As one sort key it is ``(requests in the window, recency)``: every cold model has a count
of 0, so recency alone orders them, ahead of every warm one. Against LRU this keeps a
hot model through a burst of one-off models (each has one request in the window, the
hot one many); against LFU, a model stops being protected one window after its last use,
with no ageing to tune.

* The last inference is the last ``record_access``. A model loaded and never used since
  (re-adopted at start-up, preloaded) has 0 requests and its load as its last inference:
  it is cold at once. The cache records a miss's load and then the waiting request's use,
  so an ordinary load starts warm with one request.
* Recency is the order the uses were recorded in, not the ``now`` values (as LRU), so a
  replayed trace and a live cache order models alike.
* Counts are kept in ``BUCKETS`` buckets of ``window_s / BUCKETS`` seconds (1 s for the
  default 60 s window): a request counts for between ``window_s - window_s / BUCKETS``
  and ``window_s`` seconds. A ``now`` earlier than a key's latest bucket counts there.

Cost: ``record_access`` is O(1) amortised (one bucket touched; expired buckets dropped);
``victims`` is O(m log m) for m candidates (plus at most ``BUCKETS`` buckets each);
``next_victim`` is O(1) while the least recent model is cold, else O(n).

``window_s`` is the setting ``cache.policy_window_s`` (``from_settings``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from tfscache.cache.policy import EvictionPolicy, Key


class OldestPolicy(EvictionPolicy):
    """Evict by ``(requests in the last window_s seconds, recency)``, lowest first."""

    name = "oldest"
    BUCKETS = 60

    def __init__(self, window_s: float = 60.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._width = self.window_s / self.BUCKETS
        # key -> sequence number of its last use; oldest first
        self._recent: OrderedDict[Key, int] = OrderedDict()
        # key -> [[bucket, requests], ...], oldest first
        self._buckets: dict[Key, deque[list[int]]] = {}
        self._seq = 0

    @classmethod
    def from_settings(cls, section: Any) -> OldestPolicy:
        return cls(section.policy_window_s)

    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        if key not in self._recent:  # a new measurement of a resident key keeps its place and count
            self._touch(key)

    def record_access(self, key: Key, now: float) -> None:
        self._touch(key)
        bucket = self._bucket(now)
        counts = self._buckets[key]
        if counts and bucket <= counts[-1][0]:
            counts[-1][1] += 1
        else:
            counts.append([bucket, 1])
        while counts[0][0] <= bucket - self.BUCKETS:
            counts.popleft()

    def forget(self, key: Key) -> None:
        self._recent.pop(key, None)
        self._buckets.pop(key, None)

    def victims(self, candidates: Iterable[Key], now: float) -> list[Key]:
        wanted = set(candidates)
        unknown = [key for key in wanted if key not in self._recent]
        known = [key for key in wanted if key in self._recent]
        return unknown + sorted(known, key=lambda key: self._order(key, now))

    def next_victim(self, now: float) -> Key | None:
        """The first of every tracked key in eviction order; None when empty."""
        oldest = next(iter(self._recent), None)
        if oldest is None or self.requests(oldest, now) == 0:
            return oldest  # the least recent model is cold: no key sorts before it
        return min(self._recent, key=lambda key: self._order(key, now))

    def requests(self, key: Key, now: float) -> int:
        """Requests for ``key`` in the window that ends at ``now`` (0 for an unknown key)."""
        oldest = self._bucket(now) - self.BUCKETS
        return sum(n for bucket, n in self._buckets.get(key, ()) if bucket > oldest)

    def _order(self, key: Key, now: float) -> tuple[int, int]:
        return self.requests(key, now), self._recent[key]

    def _touch(self, key: Key) -> None:
        self._seq += 1
        self._recent[key] = self._seq
        self._recent.move_to_end(key)
        self._buckets.setdefault(key, deque())

    def _bucket(self, now: float) -> int:
        return math.floor(now / self._width)
