"""Replay a log with co-access prefetch on and off: ``tfscache simulate --prefetch``.

Each node's requests (tfscache's own routing, as ``tfscache.sim.engine``) are replayed in time
order through a ledger and the node's policy, with the live cache's own code for every decision:
``planner.plan`` for a request's load and its victims, ``planner.plan_prefetch`` for a prefetch's
room and victims, and ``cache.prefetch.CoAccess`` for what to prefetch. Unlike the timeless
``replay``, loads take time here, because a prefetch helps only by starting a load earlier:

* a node loads in batches, as the live reloader does: the cold models requested while a batch
  loads go together in the next one, which ends (its requests served) after its slowest model's
  ``load_seconds`` (the node loads a batch's models in parallel); requests take no time;
* a request whose model is READY is a hit; any other is *cold*: it waits for its model's batch,
  joining a load in flight (a prefetch's too), else queued for the next batch;
* with prefetch on, every request teaches the learner, and its likely cold follower is queued
  as a prefetch; a prefetch is a batch of its own, started only when the loader is idle with no
  cold request queued and there is room (``plan_prefetch``); one not started within ``window_s``
  is dropped, as live. A cold request that arrives during a prefetch waits for it to end.

Reported per configuration, prefetch off and on: cold requests; *follower* requests (those that
came within ``follow_s`` after the node's previous request, for another model: the second stage
of a pipeline) and how many of them were cold; load seconds and loads (prefetches included);
total wait (seconds cold requests waited); prefetch loads started, used (requested before
evicted) and wasted (evicted unused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan, plan_prefetch
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.prefetch import CoAccess, CoAccessSettings
from tfscache.sim.engine import Request, split
from tfscache.sim.trace import Trace

FOLLOW_S = 0.05  # a request this soon after the node's previous one, for another model, is a follower


@dataclass(frozen=True)
class PrefetchConfig:
    """One simulated cluster, replayed with prefetch off (``learner`` None) or on."""

    policy: str
    nodes: int
    max_models: int = 0
    memory_bytes: int = 0
    learner: CoAccessSettings | None = None


@dataclass
class PrefetchCounts:
    """What one node (or, summed, a cluster) did."""

    requests: int = 0
    cold: int = 0
    followers: int = 0
    cold_followers: int = 0
    loads: int = 0
    load_seconds: float = 0.0
    wait_seconds: float = 0.0
    prefetches: int = 0
    used: int = 0
    wasted: int = 0

    def add(self, other: PrefetchCounts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class PrefetchResult:
    config: PrefetchConfig
    counts: PrefetchCounts = field(default_factory=PrefetchCounts)

    def as_dict(self) -> dict:
        return {"policy": self.config.policy, "nodes": self.config.nodes, "max_models": self.config.max_models,
                "memory_bytes": self.config.memory_bytes, "prefetch": self.config.learner is not None,
                **asdict(self.counts)}


class _Waiting:
    """A replayed request waiting for its model (never gives up)."""

    @staticmethod
    def done() -> bool:
        return False


_WAITING = _Waiting()


class _Node:
    """One node's replay: a ledger, its policy, the reloader's batches and (prefetch on) a learner."""

    def __init__(self, policy: EvictionPolicy, caps: Caps, learner: CoAccess | None, follow_s: float) -> None:
        self.ledger, self.policy, self.caps, self.learner = Ledger(policy), policy, caps, learner
        self.follow_s = follow_s
        self.batch: list = []  # the keys loading now, together
        self.free_at = 0.0  # when the batch in flight ends
        self.waiting: dict = {}  # key -> arrival times of the cold requests waiting for it
        self.sizes: dict = {}  # key -> (bytes, load seconds), as the log last said
        self.counts = PrefetchCounts()
        self.last: tuple[float, object] | None = None  # (time, key) of the node's previous request

    def request(self, key, now: float, size: int, cost: float) -> None:
        c, ledger = self.counts, self.ledger
        self.finish(now)
        self.sizes[key] = (size, cost)
        c.requests += 1
        follower = self.last is not None and self.last[1] != key and now - self.last[0] <= self.follow_s
        self.last = (now, key)
        c.followers += follower
        if ledger.first_use(key):  # READY, or LOADING: it joins the prefetch in flight
            c.used += 1
        if ledger.ready(key) is not None:
            ledger.accessed(key, now)
        else:
            c.cold += 1
            c.cold_followers += follower
            self.waiting.setdefault(key, []).append(now)
            if key not in ledger.entries:
                ledger.requested(key, _WAITING, size, size, now)
        if self.learner is not None:
            self.learner.observe(key, now)
            for after in self.learner.followers(key)[:1]:
                if after in self.sizes:
                    ledger.prefetch(after, self.sizes[after][0], self.sizes[after][0], now)
        if not self.batch and ledger.pending:  # the loader is idle and there is work
            self.next_batch(now)

    def next_batch(self, now: float) -> None:
        """The loader is idle at ``now``: load what the planner admits, else a prefetch with room."""
        ledger = self.ledger
        decided = plan(ledger, self.caps, self.policy, now)
        victims, keys = decided.victims, decided.admit
        if not keys and self.learner is not None:
            ledger.drop_prefetches(now - self.learner.settings.window_s)
            prefetch = plan_prefetch(ledger, self.caps, self.policy, now)
            if prefetch is not None:
                keys, victims = [prefetch[0]], prefetch[1]
                self.counts.prefetches += 1
        for victim in victims:
            if ledger.entries[victim].prefetched:
                self.counts.wasted += 1
            ledger.retire(victim)
            ledger.unloaded(victim)
        for key in keys:
            ledger.admitted(key, now)
        self.batch = keys
        self.free_at = now + max((self.sizes[k][1] for k in keys), default=0.0)
        self.counts.loads += len(keys)
        self.counts.load_seconds += sum(self.sizes[k][1] for k in keys)

    def finish(self, now: float) -> None:
        """Every batch that ended by ``now``: its models READY, their requests served; the next starts."""
        while self.batch and self.free_at <= now:
            ended, batch = self.free_at, self.batch
            for key in batch:
                self.ledger.loaded(key, self.sizes[key][1], ended)
                for arrival in self.waiting.pop(key, ()):
                    self.counts.wait_seconds += ended - arrival
                    self.ledger.accessed(key, ended)
            self.batch = []
            if self.ledger.pending:
                self.next_batch(ended)


def replay_prefetch(requests: list[Request], policy: EvictionPolicy, config: PrefetchConfig,
                    follow_s: float = FOLLOW_S) -> PrefetchCounts:
    """One node's requests under ``policy``, prefetching when ``config.learner`` is set."""
    learner = CoAccess(config.learner) if config.learner is not None else None
    node = _Node(policy, Caps(config.max_models, config.memory_bytes), learner, follow_s)
    for key, now, size, cost, _ in requests:
        if config.memory_bytes and size > config.memory_bytes:
            node.counts.requests += 1  # uncacheable: refused, never loaded
            continue
        node.request(key, now, size, cost)
    node.finish(float("inf"))
    return node.counts


def simulate_prefetch(trace: Trace, configs: list[PrefetchConfig], factory: Callable[[str, int, int], EvictionPolicy],
                      follow_s: float = FOLLOW_S) -> list[PrefetchResult]:
    """Every configuration's cluster-wide counts, in the order given."""
    splits: dict[int, list[list[Request]]] = {}
    results = []
    for config in configs:
        if config.nodes not in splits:
            splits[config.nodes] = split(trace, config.nodes)
        result = PrefetchResult(config)
        for requests in splits[config.nodes]:
            result.counts.add(replay_prefetch(requests, factory(config.policy, config.max_models,
                                                                config.memory_bytes), config, follow_s))
        results.append(result)
    return results


def table(results: list[PrefetchResult]) -> str:
    """The report, one row per configuration (prefetch off, then on)."""
    head = ("policy", "nodes", "max_models", "memory", "prefetch", "cold", "followers", "cold_follow",
            "loads", "load_s", "wait_s", "started", "used", "wasted")
    rows = [head]
    for r in results:
        c, k = r.counts, r.config
        rows.append((k.policy, str(k.nodes), str(k.max_models), str(k.memory_bytes),
                     "on" if k.learner is not None else "off", str(c.cold), str(c.followers),
                     str(c.cold_followers), str(c.loads), f"{c.load_seconds:.1f}", f"{c.wait_seconds:.1f}",
                     str(c.prefetches), str(c.used), str(c.wasted)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)
