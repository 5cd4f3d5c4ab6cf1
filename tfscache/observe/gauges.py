"""The gauges (and the per-backend counters) of ``tfscache.observe.metrics``, computed when scraped.

``StateCollector`` reads what it is given at every scrape: the local nodes (``NodeView``:
name, CacheManager or None while down, health), the ring's size, every backend's name,
and the counts of node restarts, forwards and retries kept by ``Metrics``. Every node gets
every series (0 included), so a query over a node that did nothing finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tfscache.cache.ledger import LOADING, READY, UNLOADING
from tfscache.cache.tiers import GPU, HOST

STATES = (LOADING, READY, UNLOADING)  # ResidentModel.state: "loading", "available", "unloading"


def by_state(resident: Iterable[Any]) -> dict[str, list[Any]]:
    """``snapshot()`` entries grouped by state: every state in STATES is a key, empty or not."""
    groups: dict[str, list[Any]] = {state: [] for state in STATES}
    for model in resident:
        groups.setdefault(model.state, []).append(model)
    return groups


def caps(cache: Any) -> tuple[int, int]:
    """A CacheManager's (max_models, memory_bytes); 0 = no cap."""
    return cache.settings.max_models_per_node, cache.settings.memory_per_node


def lru_idle_age(resident: Iterable[Any], now: float) -> float | None:
    """Seconds since the least recently used idle model was last used: available, no lease, not
    pinned (the next victim of an LRU policy); None when there is none."""
    idle = [m.last_use for m in resident if m.state == READY and m.leases == 0 and not m.pinned]
    return max(0.0, now - min(idle)) if idle else None


@dataclass(frozen=True)
class NodeView:
    """What the gauges read of one local node: its name, its cache (None while down), health."""

    name: str
    cache: Any  # a CacheManager, or None
    healthy: bool


@dataclass(frozen=True)
class Sources:
    """Where the collector reads from at scrape time (``Metrics.watch`` sets them)."""

    nodes: Callable[[], Iterable[NodeView]]
    ring_nodes: Callable[[], int]
    backends: Callable[[], Iterable[str]]  # every backend on the ring: local nodes and peers


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StateCollector:
    """The gauges over the local nodes, and the per-backend counters, computed when scraped."""

    def __init__(
        self,
        sources: Callable[[], Sources],
        counts: Callable[[], dict[str, dict[str, int]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sources = sources
        self._counts = counts  # family name -> {node: count}: node_restarts, forwards, retries
        self._clock = clock

    def describe(self):
        return []  # computed at collect time; nothing to check at registration

    def collect(self):
        sources = self._sources()
        views = list(sources.nodes())
        # each node's versions, read once per scrape for every family below
        snapshots = {v.name: list(v.cache.snapshot()) if v.cache is not None else [] for v in views}
        families = [*self._resident(views, snapshots), *self._usage(views, snapshots),
                    *self._tiers(views, snapshots)]
        families.append(GaugeMetricFamily("tfscache_ring_nodes", "Nodes (or sidecars) on the ring.",
                                          value=sources.ring_nodes()))
        families.extend(self._counters([v.name for v in views], list(sources.backends())))
        return families

    def _resident(self, views: list[NodeView], snapshots: dict[str, list]) -> list[GaugeMetricFamily]:
        models = _gauge(
            "tfscache_resident_models",
            "Model versions in a node's config, by state (loading, available, unloading).",
            ["node", "state"],
        )
        size = _gauge(
            "tfscache_resident_bytes",
            "Bytes of the models in a node's config, by state.",
            ["node", "state", "kind"],
        )
        for view in views:
            for state, group in by_state(snapshots[view.name]).items():
                models.add_metric([view.name, state], len(group))
                size.add_metric(
                    [view.name, state, "measured"], sum(m.bytes for m in group if m.measured)
                )
                size.add_metric(
                    [view.name, state, "estimated"], sum(m.bytes for m in group if not m.measured)
                )
        return [models, size]

    def _usage(self, views: list[NodeView], snapshots: dict[str, list]) -> list[GaugeMetricFamily]:
        cap_models = _gauge(
            "tfscache_cap_models", "A node's cap on model versions (0 = none).", ["node"]
        )
        cap_bytes = _gauge(
            "tfscache_cap_bytes", "A node's cap on model bytes (0 = none).", ["node"]
        )
        used_models = _gauge(
            "tfscache_used_models",
            "Model versions counting against the cap: loading and available.",
            ["node"],
        )
        used_bytes = _gauge(
            "tfscache_used_bytes",
            "Bytes counting against the cap: loading and available.",
            ["node"],
        )
        idle_age = _gauge(
            "tfscache_lru_idle_age_seconds",
            "Seconds since the least recently used idle model was used (absent: none idle).",
            ["node"],
        )
        leases = _gauge(
            "tfscache_leases_in_flight", "Requests holding a model on a node.", ["node"]
        )
        queue = _gauge(
            "tfscache_load_queue_depth", "Cold model versions waiting to load.", ["node"]
        )
        healthy = _gauge(
            "tfscache_node_healthy", "1 while the node's cache can load, else 0.", ["node"]
        )
        now = self._clock()
        for view in views:
            cache = view.cache
            resident = snapshots[view.name]
            counting = [m for m in resident if m.state != UNLOADING]
            used_models.add_metric([view.name], len(counting))
            used_bytes.add_metric([view.name], sum(m.bytes for m in counting))
            if cache is not None:  # a node that is down has no cache, and no caps to report
                count_cap, bytes_cap = caps(cache)
                cap_models.add_metric([view.name], count_cap)
                cap_bytes.add_metric([view.name], bytes_cap)
            age = lru_idle_age(resident, now)
            if age is not None:
                idle_age.add_metric([view.name], age)
            leases.add_metric([view.name], sum(m.leases for m in resident))
            queue.add_metric([view.name], len(list(cache.queue())) if cache is not None else 0)
            healthy.add_metric([view.name], 1 if view.healthy else 0)
        return [cap_models, cap_bytes, used_models, used_bytes, idle_age, leases, queue, healthy]

    def _tiers(self, views: list[NodeView], snapshots: dict[str, list]) -> list[GaugeMetricFamily]:
        """Where the available versions are (docs/tiers.md), and the GPU bytes against the GPU cap."""
        models = _gauge(
            "tfscache_tier_models",
            "Available model versions by tier: gpu, or host (demoted with cache.demote = host).",
            ["node", "tier"],
        )
        size = _gauge(
            "tfscache_tier_bytes",
            "Host-memory bytes of the available model versions by tier.",
            ["node", "tier"],
        )
        gpu_used = _gauge(
            "tfscache_gpu_used_bytes",
            "GPU bytes of a node's model versions as learned at their loads (0: none known).",
            ["node"],
        )
        gpu_cap = _gauge("tfscache_cap_gpu_bytes", "A node's cap on GPU bytes (0 = none).", ["node"])
        for view in views:
            cache = view.cache
            ready = [m for m in snapshots[view.name] if m.state == READY]
            for tier in (GPU, HOST):
                on = [m for m in ready if m.tier == tier]
                models.add_metric([view.name, tier], len(on))
                size.add_metric([view.name, tier], sum(m.bytes for m in on))
            if cache is not None:  # a node that is down has no cache to report
                used, cap = cache.gpu_usage()
                gpu_used.add_metric([view.name], used)
                gpu_cap.add_metric([view.name], cap)
        return [models, size, gpu_used, gpu_cap]

    def _counters(self, nodes: list[str], backends: list[str]) -> list[CounterMetricFamily]:
        counts = self._counts()
        docs = {
            "tfscache_node_restarts": (
                "Times a local node process exited and was restarted.",
                nodes,
            ),
            "tfscache_forwards": (
                "Requests sent on to a peer sidecar that owns the model, by peer.",
                backends,
            ),
            "tfscache_retries": (
                "Tries on a node or peer that failed UNAVAILABLE or CANCELLED and were "
                "retried elsewhere or later.",
                backends,
            ),
            "tfscache_dataplane_routed": (
                "Warm requests HAProxy sent straight to a node, or to a peer sidecar "
                "(server.data_plane = haproxy), by node, as its stick table counted them.",
                nodes,
            ),
        }
        families = []
        for name, (doc, names) in docs.items():
            family = CounterMetricFamily(name, doc, labels=["node"])
            seen = counts.get(name, {})
            for node in dict.fromkeys([*names, *seen]):
                family.add_metric([node], seen.get(node, 0))
            families.append(family)
        return families
