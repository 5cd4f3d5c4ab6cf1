"""Co-access learning for prefetch: which model follows which. Pure bookkeeping, no I/O, no asyncio.

``CoAccess.arrived(key, now)`` hears every request (warm or cold) of one node as it arrives, and
``answered(key, now)`` as it is answered (``observe`` is both at once: a hit), in time order;
``followers(key)`` answers "``key`` was just requested: which models are likely asked next".
The cache manager prefetches them (tfscache/cache/manager.py, the reloader's ``prefetch``);
``tfscache simulate --prefetch`` replays a log through the same class (tfscache/sim/prefetch.py).

What it counts, for a predecessor A and a follower B:

* ``seen(A)``: requests of A answered;
* ``pairs(A, B)``: requests of B that arrived within ``window_s`` seconds after a request of A was
  answered (a pipeline's next stage is sent when the previous one answers, however long A waited
  for its load); each A counted once per request of B, and A never follows itself.

Both are *decayed* by A's own requests: each request of A ages A's counts by
``2 ** (-1 / halflife)`` (a pair count lazily: it remembers A's request clock it was set at), so
``pairs / seen`` is the share of A's recent requests that B followed, however rarely A comes, and
a pipeline that stops fades out within a few half-lives of A's requests. B is a likely follower
of A when ``pairs(A, B) >= min_support`` (seen often enough to be no accident) and
``pairs(A, B) / seen(A) >= confidence``.

Memory is bounded: at most ``max_models`` predecessors are tracked (the least recently
requested forgotten first), each with at most ``max_candidates`` followers (the weakest
replaced by a new one), and the window holds at most ``max_window`` recent requests. So
tens of thousands of models cost a few MB; ``observe`` is O(window), ``followers`` O(candidates).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass

Key = Hashable


@dataclass(frozen=True)
class CoAccessSettings:
    """The learner's knobs (the cache's ``prefetch_*`` settings; docs/prefetch.md has the reasoning)."""

    window_s: float = 0.25
    confidence: float = 0.2
    min_support: float = 1.5
    halflife: float = 50.0
    max_models: int = 50_000
    max_candidates: int = 4
    max_window: int = 8

    @classmethod
    def from_section(cls, section) -> CoAccessSettings:
        """The knobs of a ``CacheSection`` (its ``prefetch_*`` fields)."""
        return cls(
            section.prefetch_window_s,
            section.prefetch_confidence,
            section.prefetch_min_support,
            section.prefetch_halflife_requests,
            section.prefetch_max_models,
        )

    def __post_init__(self) -> None:
        if not (
            self.window_s > 0
            and 0 < self.confidence <= 1
            and self.min_support > 0
            and self.halflife > 0
            and self.max_models >= 1
            and self.max_candidates >= 1
            and self.max_window >= 1
        ):
            raise ValueError(f"bad co-access settings: {self}")


class _Stats:
    """One predecessor: its decayed request count, its own request clock, and its candidate
    followers' decayed pair counts."""

    __slots__ = ("seen", "clock", "pairs")

    def __init__(self) -> None:
        self.seen, self.clock = 0.0, 0
        # follower -> (count, the predecessor's clock when set)
        self.pairs: dict[Key, tuple[float, int]] = {}


class CoAccess:
    """Learns online which model follows which on one node (see the module docstring)."""

    def __init__(self, settings: CoAccessSettings | None = None) -> None:
        self.settings = s = settings or CoAccessSettings()
        self._decay = math.exp2(-1.0 / s.halflife)
        self._stats: OrderedDict[Key, _Stats] = OrderedDict()  # least recently requested first
        # (time, key) answered within window_s, oldest first
        self._recent: deque[tuple[float, Key]] = deque()

    def __len__(self) -> int:
        """Predecessors tracked now (bounded by ``max_models``)."""
        return len(self._stats)

    def observe(self, key: Key, now: float) -> None:
        """A request for ``key`` at ``now`` (seconds, non-decreasing per node), answered at once."""
        self.arrived(key, now)
        self.answered(key, now)

    def arrived(self, key: Key, now: float) -> None:
        """A request for ``key`` arrived at ``now``: it follows the requests answered within ``window_s``
        before (a pipeline's next stage is sent when the previous one answers)."""
        recent = self._recent
        while recent and now - recent[0][0] > self.settings.window_s:
            recent.popleft()
        done = {key}  # each predecessor once per request; never the model itself
        for _, before in recent:
            if before not in done:
                done.add(before)
                stats = self._stats.get(before)
                if stats is not None:
                    self._pair(stats, key)

    def answered(self, key: Key, now: float) -> None:
        """A request for ``key`` was answered at ``now`` (non-decreasing, as ``arrived``'s): counted
        as a possible predecessor from now on."""
        s = self.settings
        recent = self._recent
        while recent and (now - recent[0][0] > s.window_s or len(recent) >= s.max_window):
            recent.popleft()
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = _Stats()
            if len(self._stats) > s.max_models:
                self._stats.popitem(last=False)
        else:
            self._stats.move_to_end(key)
        stats.clock += 1
        stats.seen = stats.seen * self._decay + 1.0
        recent.append((now, key))

    def followers(self, key: Key) -> list[Key]:
        """The likely followers of ``key`` now, most likely first (see the module docstring)."""
        stats = self._stats.get(key)
        if stats is None or not stats.pairs:
            return []
        s = self.settings
        aged = [
            (self._aged(stats, *counted), follower) for follower, counted in stats.pairs.items()
        ]
        scored = [(count, follower) for count, follower in aged
                  if count >= s.min_support and count >= s.confidence * stats.seen]
        return [follower for _, follower in sorted(scored, key=lambda pair: -pair[0])]

    def confidence(self, before: Key, after: Key) -> float:
        """``pairs(before, after) / seen(before)`` now (0 when unknown); for tests and reports."""
        stats = self._stats.get(before)
        if stats is None or after not in stats.pairs:
            return 0.0
        return self._aged(stats, *stats.pairs[after]) / max(stats.seen, 1e-12)

    def _pair(self, stats: _Stats, follower: Key) -> None:
        pairs = stats.pairs
        old = pairs.get(follower)
        if old is None and len(pairs) >= self.settings.max_candidates:
            weakest = min(pairs, key=lambda k: self._aged(stats, *pairs[k]))
            del pairs[weakest]  # space for the newcomer: the weakest candidate goes
        count = self._aged(stats, *old) if old is not None else 0.0
        pairs[follower] = (count + 1.0, stats.clock)

    def _aged(self, stats: _Stats, count: float, at: int) -> float:
        """A pair ``count`` set at the predecessor's clock ``at``, aged by its requests since."""
        return count * self._decay ** (stats.clock - at) if at != stats.clock else count


class PrefetchCounts:
    """One node's prefetch loads, counted apart from its other loads (tfscache/observe/prefetchmetrics.py).

    ``started``: prefetch loads sent to the node; ``completed`` / ``failed``: how they ended;
    ``used``: prefetched versions then requested before they left; ``wasted``: evicted unused.
    """

    KINDS = ("started", "completed", "failed", "used", "wasted")

    def __init__(self) -> None:
        self._counts = dict.fromkeys(self.KINDS, 0)

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to ``what`` (one of ``KINDS``; KeyError otherwise)."""
        self._counts[what] += n

    def as_dict(self) -> dict[str, int]:
        return dict(self._counts)
