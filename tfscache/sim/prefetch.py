"""Replay a log with co-access prefetch on and off: ``tfscache simulate --prefetch``.

Each node's requests (tfscache's own routing, as ``tfscache.sim.engine``) are replayed in time
order through a ledger and the node's policy, with the live cache's own code for every decision:
``planner.plan`` for a request's load and its victims, ``planner.plan_prefetch`` for a prefetch's
room and victims, and ``cache.prefetch.CoAccess`` for what to prefetch. Unlike the timeless
``replay``, loads take time here (a discrete-event replay), because a prefetch helps only by
starting a load earlier:

* a node loads in batches, as the live reloader does: the cold models requested while a batch
  loads go together in the next one; the node loads a batch's models in parallel, and the batch
  ends (its requests served) after its slowest model's ``load_seconds``; requests take no time;
* a request whose model is READY is a hit; any other is *cold*: it waits for its model's load,
  joining one in flight (a prefetch's too), else queued for the next batch;
* a *follower* (a request within ``follow_s`` after the node's previous request, for another
  model: the second stage of a pipeline) is sent when its predecessor is answered, as a
  pipeline's client sends it: when the predecessor waited for a load, the follower comes that
  long later (the log's gap after the answer);
* with prefetch on, as live (tfscache/cache/prefetcher.py): a request's likely cold followers
  are queued as prefetches when it arrives, and the learner hears it when it is served; the
  reloader's step admits the prefetches that fit with idle room beside its real loads, loaded
  apart (a real load's requests are served when the real loads end, a prefetch when its own
  does), or alone when nothing real waits; one not started within ``window_s`` is dropped.

Reported per configuration, prefetch off and on: cold requests; follower requests and how many
of them were cold; load seconds and loads (prefetches included); total wait (seconds cold
requests waited); prefetch loads started, used (requested before evicted) and wasted (evicted
unused).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan, plan_prefetch
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.prefetch import CoAccess, CoAccessSettings
from tfscache.sim.engine import Request, split
from tfscache.sim.trace import Trace

# a request this soon after the node's previous one, for another model, is a follower
FOLLOW_S = 0.05


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
        return {
            "policy": self.config.policy,
            "nodes": self.config.nodes,
            "max_models": self.config.max_models,
            "memory_bytes": self.config.memory_bytes,
            "prefetch": self.config.learner is not None,
            **asdict(self.counts),
        }


class _Waiting:
    """A replayed request waiting for its model (never gives up)."""

    @staticmethod
    def done() -> bool:
        return False


_WAITING = _Waiting()


class _Request:
    """One replayed request: when it was sent, whether it is a follower, when it was answered, and
    the followers to send once it is (each with its gap after the answer)."""

    __slots__ = ("key", "sent", "size", "cost", "follower", "answered", "then")

    def __init__(self, key, sent: float, size: int, cost: float, follower: bool) -> None:
        self.key, self.sent, self.size, self.cost, self.follower = key, sent, size, cost, follower
        self.answered: float | None = None
        self.then: list[tuple[float, _Request]] = []


class _Node:
    """One node's replay: a ledger, its policy, the reloader's batches and (prefetch on) a learner."""

    def __init__(self, policy: EvictionPolicy, caps: Caps, learner: CoAccess | None) -> None:
        self.ledger, self.policy, self.caps, self.learner = Ledger(policy), policy, caps, learner
        self.loading: dict = {}  # key -> when its load ends (the batch in flight)
        self.waiting: dict = {}  # key -> the cold requests waiting for it
        self.sizes: dict = {}  # key -> (bytes, load seconds), as the log last said
        # heap of (time, seq, _Request): followers sent once their predecessor was answered
        self.sent: list = []
        self.seq = itertools.count()
        self.counts = PrefetchCounts()

    def next_end(self) -> float:
        return min(self.loading.values(), default=float("inf"))

    def request(self, r: _Request, now: float) -> None:
        c, ledger, key = self.counts, self.ledger, r.key
        self.sizes[key] = (r.size, r.cost)
        c.requests += 1
        follow = []
        # as the live Prefetcher: likely followers kept warm, or queued
        if self.learner is not None:
            self.learner.arrived(key, now)
            follow = self.learner.followers(key)[:1]
            for after in follow:
                if ledger.ready(after) is not None:
                    ledger.accessed(after, now)
        if ledger.first_use(key):  # READY, or LOADING: it joins the prefetch in flight
            c.used += 1
        if ledger.ready(key) is not None:
            ledger.accessed(key, now)
            self.answer(r, now)
        else:
            c.cold += 1
            c.cold_followers += r.follower
            self.waiting.setdefault(key, []).append(r)
            if key not in ledger.entries:
                ledger.requested(key, _WAITING, r.size, r.size, now)
        for after in follow:
            if after in self.sizes and after not in ledger.entries:
                ledger.prefetch(after, self.sizes[after][0], self.sizes[after][0], now, key)
        if not self.loading and ledger.pending:  # the loader is idle and there is work
            self.next_batch(now)

    def answer(self, r: _Request, now: float) -> None:
        """``r`` is served at ``now``: the learner hears it, and its followers are sent."""
        r.answered = now
        if self.learner is not None:
            self.learner.answered(r.key, now)
        for gap, follower in r.then:
            heapq.heappush(self.sent, (now + gap, next(self.seq), follower))

    def next_batch(self, now: float) -> None:
        """The loader is idle at ``now``: load what the planner admits, and prefetches with room beside."""
        ledger, counts = self.ledger, self.counts
        decided = plan(ledger, self.caps, self.policy, now)
        victims, keys = list(decided.victims), list(decided.admit)
        for victim in victims:
            self.unload(victim)
        for key in keys:
            ledger.admitted(key, now)
        prefetched = []
        if self.learner is not None and not decided.blocked:
            ledger.drop_prefetches(now - self.learner.settings.window_s)
            while (
                planned := plan_prefetch(ledger, self.caps, self.policy, now, victims=True)
            ) is not None:
                for victim in planned[1]:
                    self.unload(victim)
                ledger.admitted(planned[0], now)
                prefetched.append(planned[0])
                counts.prefetches += 1
        parts = [keys] + [[k] for k in prefetched] if keys else [prefetched]
        for part in parts:  # as the live reloader's load: each part's requests served when it ends
            end = now + max((self.sizes[k][1] for k in part), default=0.0)
            self.loading.update(dict.fromkeys(part, end))
        counts.loads += len(keys) + len(prefetched)
        counts.load_seconds += sum(self.sizes[k][1] for k in keys + prefetched)

    def unload(self, victim) -> None:
        if self.ledger.entries[victim].prefetched:
            self.counts.wasted += 1
        self.ledger.retire(victim)
        self.ledger.unloaded(victim)

    def end(self, now: float) -> None:
        """The loads ending at ``now``: their models READY, their requests served; the next batch starts
        once every part of this one ended."""
        for key in [k for k, end in self.loading.items() if end <= now]:
            del self.loading[key]
            self.ledger.loaded(key, self.sizes[key][1], now)
            for r in self.waiting.pop(key, ()):
                self.counts.wait_seconds += now - r.sent
                self.ledger.accessed(key, now)
                self.answer(r, now)
        if not self.loading and self.ledger.pending:
            self.next_batch(now)


def replay_prefetch(requests: list[Request], policy: EvictionPolicy, config: PrefetchConfig,
                    follow_s: float = FOLLOW_S) -> PrefetchCounts:
    """One node's requests under ``policy``, prefetching when ``config.learner`` is set."""
    learner = CoAccess(config.learner) if config.learner is not None else None
    node = _Node(policy, Caps(config.max_models, config.memory_bytes), learner)
    # last: the node's previous request in the log (its time, _Request)
    inf, i, last = float("inf"), 0, None
    while True:
        logged = requests[i][1] if i < len(requests) else inf
        sent = node.sent[0][0] if node.sent else inf
        ends = node.next_end()
        if ends == sent == logged == inf:
            break
        if ends <= min(sent, logged):  # a load that ends at t serves before the requests of t
            node.end(ends)
        elif sent <= logged:
            _, _, r = heapq.heappop(node.sent)
            r.sent = sent
            node.request(r, sent)
        else:
            key, now, size, cost, _ = requests[i]
            i += 1
            if config.memory_bytes and size > config.memory_bytes:
                node.counts.requests += 1  # uncacheable: refused, never loaded
                continue
            follower = last is not None and last[1].key != key and now - last[0] <= follow_s
            r = _Request(key, now, size, cost, follower)
            node.counts.followers += follower
            if follower and last[1].answered is None:  # sent when its predecessor is answered
                last[1].then.append((now - last[0], r))
            else:
                node.request(r, now)
            last = (now, r)
    return node.counts


def simulate_prefetch(
    trace: Trace,
    configs: list[PrefetchConfig],
    factory: Callable[[str, int, int], EvictionPolicy],
    follow_s: float = FOLLOW_S,
) -> list[PrefetchResult]:
    """Every configuration's cluster-wide counts, in the order given."""
    splits: dict[int, list[list[Request]]] = {}
    results = []
    for config in configs:
        if config.nodes not in splits:
            splits[config.nodes] = split(trace, config.nodes)
        result = PrefetchResult(config)
        for requests in splits[config.nodes]:
            result.counts.add(
                replay_prefetch(
                    requests,
                    factory(config.policy, config.max_models, config.memory_bytes),
                    config,
                    follow_s,
                )
            )
        results.append(result)
    return results


def table(results: list[PrefetchResult]) -> str:
    """The report, one row per configuration (prefetch off, then on)."""
    head = (
        "policy",
        "nodes",
        "max_models",
        "memory",
        "prefetch",
        "cold",
        "followers",
        "cold_follow",
        "loads",
        "load_s",
        "wait_s",
        "started",
        "used",
        "wasted",
    )
    rows = [head]
    for r in results:
        c, k = r.counts, r.config
        rows.append(
            (
                k.policy,
                str(k.nodes),
                str(k.max_models),
                str(k.memory_bytes),
                "on" if k.learner is not None else "off",
                str(c.cold),
                str(c.followers),
                str(c.cold_followers),
                str(c.loads),
                f"{c.load_seconds:.1f}",
                f"{c.wait_seconds:.1f}",
                str(c.prefetches),
                str(c.used),
                str(c.wasted),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)
