"""Replay a trace through per-node GPU and host tiers: drop-on-evict against demotion.

Each node has a GPU tier (caps ``gpu_models``, ``gpu_bytes``) and, with ``demote="host"``, a
host tier (caps ``host_models``, ``host_bytes``); 0 is no cap, and the two tiers hold
different versions (a version promoted to the GPU leaves host memory; a model's bytes count
the same on either). Routing is the ring's, as in tfscache/sim/engine.py, and a node's
requests never overlap. Each tier is a ``Ledger`` with its own eviction policy, and each
choice is made by the live planner (``tfscache.cache.planner.plan``) with the costs of
tfscache/cache/tiers.py:

* a request for a version on the GPU is a GPU hit;
* one in host memory is answered there at once (a host hit, at ``host_slowdown`` times the
  GPU's service time); then, if ``PromoteRule.pays`` at the version's rate, it is promoted
  (``promote_s`` = ``promote_ratio`` x its load seconds);
* any other is a cold load onto the GPU (its load seconds, waited for).

Whatever leaves the GPU (for a cold load or a promotion) is demoted to host memory when
demotion is on and it saves time (``demote_pays``) and fits the host caps on its own; the
host tier makes room by its own policy, priced by ``load_s - promote_s``, and what it evicts
is dropped. The GPU tier's policy is priced by ``promote_s`` with demotion on (an evicted
version comes back from host memory) and by the load seconds with it off.

Counted: GPU hits and misses, host hits, cold loads and their seconds, promotions and their
seconds, demotions, drops (versions unloaded for good), and the seconds requests spend, from
arrival to answer (service plus any load waited for).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan
from tfscache.cache.policy import EvictionPolicy
from tfscache.cache.tiers import (
    GPU,
    HOST,
    PromoteRule,
    Rates,
    TierCosts,
    demote_pays,
    eviction_cost,
)
from tfscache.cluster.ring import Ring
from tfscache.sim.engine import WAITING, node_names
from tfscache.sim.trace import Trace


@dataclass(frozen=True)
class TierConfig:
    """One simulated cluster with tiers; costs other than the log's are ratios of it."""

    policy: str
    nodes: int
    demote: str  # "none" (drop on evict, tfscache today) or "host"
    gpu_models: int = 0
    gpu_bytes: int = 0
    host_models: int = 0
    host_bytes: int = 0
    promote_ratio: float = 0.1  # promote_s = this x the version's load seconds
    host_slowdown: float = 4.0  # host service = this x the GPU's
    service_s: float = 0.01  # GPU service where the log has none
    horizon_s: float = 60.0
    rate_tau_s: float = 60.0


@dataclass
class TierCounts:
    """What one node (or, summed, a cluster) did with its requests."""

    requests: int = 0
    gpu_hits: int = 0
    host_hits: int = 0
    cold_loads: int = 0
    uncacheable: int = 0  # larger than the GPU's byte cap alone: answered by a load every time
    promotions: int = 0
    demotions: int = 0
    drops: int = 0
    load_seconds: float = 0.0
    promote_seconds: float = 0.0
    request_seconds: float = 0.0

    def add(self, other: TierCounts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    @property
    def gpu_misses(self) -> int:
        return self.requests - self.gpu_hits


@dataclass
class TierResult:
    config: TierConfig
    counts: TierCounts

    def as_dict(self) -> dict:
        return {**asdict(self.config), **asdict(self.counts), "gpu_misses": self.counts.gpu_misses}


class _Node:
    """One node's two tiers, replayed."""

    def __init__(self, config: TierConfig, factory: Callable[[str, int, int], EvictionPolicy]):
        self.config = config
        self.gpu_policy = factory(config.policy, config.gpu_models, config.gpu_bytes)
        self.gpu = Ledger(self.gpu_policy)
        self.gpu_caps = Caps(config.gpu_models, config.gpu_bytes)
        self.demoting = config.demote == HOST
        self.host_policy = factory(config.policy, config.host_models, config.host_bytes)
        self.host = Ledger(self.host_policy)
        self.host_caps = Caps(config.host_models, config.host_bytes)
        self.rule = PromoteRule(config.horizon_s)
        self.rates = Rates(config.rate_tau_s)
        self.costs: dict[int, TierCosts] = {}
        self.sizes: dict[int, int] = {}
        self.counts = TierCounts()

    def request(self, key: int, now: float, size: int, load_s: float, service: float) -> None:
        config, counts = self.config, self.counts
        gpu_s = service if service >= 0 else config.service_s
        costs = self.costs[key] = TierCosts(
            load_s, load_s * config.promote_ratio, gpu_s, gpu_s * config.host_slowdown
        )
        self.sizes[key] = size
        counts.requests += 1
        rate = self.rates.request(key, now)
        if key in self.gpu.entries:
            counts.gpu_hits += 1
            counts.request_seconds += gpu_s
            self.gpu.accessed(key, now)
            return
        if key in self.host.entries:
            counts.host_hits += 1
            counts.request_seconds += costs.host_service_s
            self.host.accessed(key, now)
            if self.rule.pays(rate, 0, costs):
                self._leave(self.host, key)
                self._onto_gpu(key, now, costs)
                counts.promotions += 1
                counts.promote_seconds += costs.promote_s
            return
        counts.cold_loads += 1
        counts.load_seconds += load_s
        counts.request_seconds += load_s + gpu_s
        if config.gpu_bytes and size > config.gpu_bytes:
            counts.uncacheable += 1
            return
        self._onto_gpu(key, now, costs)

    def _onto_gpu(self, key: int, now: float, costs: TierCosts) -> None:
        size = self.sizes[key]
        self.gpu.requested(key, WAITING, size, size, now)
        decided = plan(self.gpu, self.gpu_caps, self.gpu_policy, now)
        if decided.admit != [key]:
            raise RuntimeError(f"planner did not admit {key!r} ({decided})")
        for victim in decided.victims:
            self._leave(self.gpu, victim)
            self._demote_or_drop(victim, now)
        self.gpu.admitted(key, now)
        self.gpu.loaded(key, eviction_cost(costs, GPU, self.config.demote), now)
        self.gpu.accessed(key, now)

    def _demote_or_drop(self, key: int, now: float) -> None:
        costs, size = self.costs[key], self.sizes[key]
        caps = self.host_caps
        if not (self.demoting and demote_pays(costs) and caps.fit(1, size)):
            self.counts.drops += 1
            return
        self.host.requested(key, WAITING, size, size, now)
        decided = plan(self.host, caps, self.host_policy, now)
        for victim in decided.victims:
            self._leave(self.host, victim)
            self.counts.drops += 1
        self.host.admitted(key, now)
        self.host.loaded(key, eviction_cost(costs, HOST, self.config.demote), now)
        self.counts.demotions += 1

    @staticmethod
    def _leave(ledger: Ledger, key: int) -> None:
        ledger.retire(key)
        ledger.unloaded(key)


def replay_tiers(trace: Trace, indices: Sequence[int], config: TierConfig,
                 factory: Callable[[str, int, int], EvictionPolicy]) -> TierCounts:
    """One node's requests (``indices`` into ``trace``, in time order) through its tiers."""
    node = _Node(config, factory)
    keys, times, sizes, loads = trace.keys, trace.times, trace.sizes, trace.load_seconds
    service = trace.service
    for i in indices:
        node.request(keys[i], times[i], sizes[i], loads[i], service[i] if service else -1.0)
    return node.counts


def simulate_tiers(trace: Trace, configs: Sequence[TierConfig],
                   factory: Callable[[str, int, int], EvictionPolicy]) -> list[TierResult]:
    """Every configuration's result, in the order given."""
    splits: dict[int, list[list[int]]] = {}
    results = []
    for config in configs:
        if config.nodes not in splits:
            splits[config.nodes] = per_node(trace, config.nodes)
        total = TierCounts()
        for indices in splits[config.nodes]:
            total.add(replay_tiers(trace, indices, config, factory))
        results.append(TierResult(config, total))
    return results


def per_node(trace: Trace, nodes: int) -> list[list[int]]:
    """Each node's requests (indices into ``trace``) as the ring routes them."""
    ring = Ring(node_names(nodes), replicas=1)
    home = [int(ring.owner(name).removeprefix("node")) for name, _ in trace.models]
    routed: list[list[int]] = [[] for _ in range(nodes)]
    for i, key in enumerate(trace.keys):
        routed[home[key]].append(i)
    return routed


def table(results: Sequence[TierResult]) -> str:
    """A Markdown table: one row per configuration, drop-on-evict beside demotion."""
    head = ("| policy | nodes | demote | GPU cap | host cap | GPU misses | host hits | cold loads "
            "| promotions | demotions | drops | load s | promote s | request s |")
    rows = [head, "|" + "---|" * 14]
    for r in results:
        c, k = r.config, r.counts
        rows.append(
            f"| {c.policy} | {c.nodes} | {c.demote} | {_cap(c.gpu_models, c.gpu_bytes)} "
            f"| {_cap(c.host_models, c.host_bytes) if c.demote == HOST else '-'} "
            f"| {k.gpu_misses:,} | {k.host_hits:,} | {k.cold_loads:,} | {k.promotions:,} "
            f"| {k.demotions:,} | {k.drops:,} | {k.load_seconds:,.0f} | {k.promote_seconds:,.0f} "
            f"| {k.request_seconds:,.0f} |"
        )
    return "\n".join(rows)


def _cap(models: int, size: int) -> str:
    parts = ([f"{models} models"] if models else []) + ([f"{size / 2**30:g} GiB"] if size else [])
    return ", ".join(parts) or "none"
