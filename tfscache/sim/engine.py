"""Replay a trace through per-node caches: a policy's counts, and Belady's.

Routing is tfscache's own: ``tfscache.cluster.ring.Ring`` over nodes ``node0 .. node{N-1}``
(the names the embedded supervisor gives), one replica per model, each request going
to its model's home node. Nodes share nothing, so each node's requests are replayed
alone, through its own policy instance, in time order.

A node's cache works as the cache manager does with requests that never overlap: a
hit records a use; a miss evicts in the policy's order until the model fits both caps
(``max_models`` models, ``memory_bytes`` bytes; 0 is no cap), then loads it (the
policy hears ``record_load`` then ``record_access``, as a lease follows a load). A
model bigger than the memory cap by itself is a miss that is never cached and never
loaded ("uncacheable"; tfscache refuses it with RESOURCE_EXHAUSTED).

Belady's MIN evicts the resident model whose next request is farthest away (models
never requested again first). It always caches the requested model, as the policies
do, and is then the most hits any such cache can get under a count cap; with a memory
cap, or counted in load seconds, it is the classic farthest-next-use heuristic rather
than a proven optimum (those problems are NP-hard), so a policy may beat it there.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan
from tfscache.cache.policy import EvictionPolicy
from tfscache.cluster.ring import Ring
from tfscache.sim.trace import Trace

BELADY = "belady"
_CHUNK = 16_384  # requests replayed between progress reports

# One request on one node: (key, time, bytes, load seconds, index of the key's next request).
Request = tuple[int, float, int, float, int]


@dataclass(frozen=True)
class Config:
    """One simulated cluster: a policy (or ``belady``), a node count and per-node caps."""

    policy: str
    nodes: int
    max_models: int = 0
    memory_bytes: int = 0


@dataclass
class Counts:
    """What one node (or, summed, a cluster) did with its requests."""

    requests: int = 0
    hits: int = 0
    uncacheable: int = 0
    evictions: int = 0
    load_seconds: float = 0.0
    peak_bytes: int = 0
    """Most bytes resident at once on one node (for a cluster: its fullest node)."""

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.hits += other.hits
        self.uncacheable += other.uncacheable
        self.evictions += other.evictions
        self.load_seconds += other.load_seconds
        self.peak_bytes = max(self.peak_bytes, other.peak_bytes)


@dataclass
class Result:
    """A configuration and its cluster-wide counts."""

    config: Config
    counts: Counts

    @property
    def hit_ratio(self) -> float:
        return self.counts.hits / self.counts.requests if self.counts.requests else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self.config), **asdict(self.counts),
                "misses": self.counts.requests - self.counts.hits, "hit_ratio": self.hit_ratio}


def node_names(nodes: int) -> list[str]:
    return [f"node{i}" for i in range(nodes)]


def split(trace: Trace, nodes: int) -> list[list[Request]]:
    """Each node's requests in time order, with each request's next-use index."""
    ring = Ring(node_names(nodes), replicas=1)
    home = [int(ring.owner(name).removeprefix("node")) for name, _ in trace.models]
    never = len(trace)
    nxt = [never] * len(trace)
    seen: dict[int, int] = {}
    keys = trace.keys
    for i in range(len(trace) - 1, -1, -1):
        k = keys[i]
        nxt[i] = seen.get(k, never)
        seen[k] = i
    per_node: list[list[Request]] = [[] for _ in range(nodes)]
    appenders = [requests.append for requests in per_node]
    for i, (k, t, size, cost) in enumerate(zip(keys, trace.times, trace.sizes, trace.load_seconds)):
        appenders[home[k]]((k, t, size, cost, nxt[i]))
    return per_node


def _chunks(
    requests: list[Request], progress: Callable[[int], None] | None
) -> Iterator[list[Request]]:
    """``requests`` in slices, reporting each to ``progress`` once replayed (keeps the hot loop free
    of it)."""
    for start in range(0, len(requests), _CHUNK):
        chunk = requests[start:start + _CHUNK]
        yield chunk
        if progress is not None:
            progress(len(chunk))


class Waiting:
    """The one request waiting for a missed model (replayed requests never overlap)."""

    @staticmethod
    def done() -> bool:
        return False


WAITING = Waiting()


def replay(requests: list[Request], policy: EvictionPolicy, max_models: int, memory_bytes: int,
           progress: Callable[[int], None] | None = None,
           record: Callable[[str, int], None] | None = None) -> Counts:
    """One node's cache under ``policy``; ``progress(n)`` after each chunk of n requests.

    Each miss is decided by the live cache's own planner (``tfscache.cache.planner.plan``)
    over a ledger of this node, so the simulator cannot disagree with the cache: the
    victims it unloads and the loads it admits are the ones the cache would choose.
    ``record(what, key)``, if given, hears every "load" and "evict" in order.
    """
    ledger = Ledger(policy)  # tells the policy of each load, access and eviction, as in the cache
    caps = Caps(max_models, memory_bytes)
    used = peak = hits = uncacheable = evictions = 0
    load_seconds = 0.0
    entries, accessed = ledger.entries, ledger.accessed
    for chunk in _chunks(requests, progress):
        for key, now, size, cost, _ in chunk:
            if key in entries:
                hits += 1
                accessed(key, now)
                continue
            if memory_bytes and size > memory_bytes:
                uncacheable += 1
                continue
            ledger.requested(key, WAITING, size, size, now)
            decided = plan(ledger, caps, policy, now)
            for victim in decided.victims:
                if record is not None:
                    record("evict", victim)
                ledger.retire(victim)
                used -= ledger.unloaded(victim).bytes
                evictions += 1
            # nothing is ever leased here: it always fits once the rest is gone
            if decided.admit != [key]:
                raise RuntimeError(f"planner did not admit {key!r} ({decided})")
            ledger.admitted(key, now)
            if record is not None:
                record("load", key)
            used += size
            if used > peak:
                peak = used
            load_seconds += cost
            ledger.loaded(key, cost, now)
            accessed(key, now)
    return Counts(len(requests), hits, uncacheable, evictions, load_seconds, peak)


def replay_belady(requests: list[Request], max_models: int, memory_bytes: int,
                  progress: Callable[[int], None] | None = None) -> Counts:
    """One node's cache under Belady's MIN (farthest next request first); ``progress`` as for replay."""
    resident: dict[int, int] = {}  # key -> bytes
    next_use: dict[int, int] = {}  # key -> index of its next request
    farthest: list[tuple[int, int]] = []  # (-next use, key), stale entries skipped
    used = peak = hits = uncacheable = evictions = 0
    load_seconds = 0.0
    push, pop = heapq.heappush, heapq.heappop
    cap = max_models or len(requests) + 1
    memory = memory_bytes or float("inf")
    for chunk in _chunks(requests, progress):
        for key, _, size, cost, nxt in chunk:
            if key in resident:
                hits += 1
                next_use[key] = nxt
                push(farthest, (-nxt, key))
                continue
            if size > memory:
                uncacheable += 1
                continue
            while len(resident) >= cap or used + size > memory:
                far, victim = pop(farthest)
                if next_use.get(victim) != -far:
                    continue  # stale
                del next_use[victim]
                used -= resident.pop(victim)
                evictions += 1
            resident[key] = size
            next_use[key] = nxt
            push(farthest, (-nxt, key))
            used += size
            if used > peak:
                peak = used
            load_seconds += cost
            if len(farthest) > 2 * len(resident) + 64:
                farthest = [(-n, k) for k, n in next_use.items()]
                heapq.heapify(farthest)
    return Counts(len(requests), hits, uncacheable, evictions, load_seconds, peak)


def simulate(
    trace: Trace,
    configs: list[Config],
    factory: Callable[[str, int, int], EvictionPolicy],
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """Every configuration's result, in the order given.

    ``factory(name, max_models, memory_bytes)`` builds a new policy for each node;
    ``progress(n)`` is called after every n requests replayed (in chunks of 16,384).
    """
    splits: dict[int, list[list[Request]]] = {}
    results = []
    for config in configs:
        if config.nodes not in splits:
            splits[config.nodes] = split(trace, config.nodes)
        total = Counts()
        for requests in splits[config.nodes]:
            if config.policy == BELADY:
                counts = replay_belady(requests, config.max_models, config.memory_bytes, progress)
            else:
                counts = replay(
                    requests,
                    factory(config.policy, config.max_models, config.memory_bytes),
                    config.max_models,
                    config.memory_bytes,
                    progress,
                )
            total.add(counts)
        results.append(Result(config, total))
    return results
