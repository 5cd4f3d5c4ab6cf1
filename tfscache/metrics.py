"""Prometheus metrics of one ``tfscache serve``: one registry per process (per ``Metrics``).

Counters and histograms move with events: the front ends count requests
(``request``), and each node's CacheManager reports hits, loads, evictions through
the ``NodeEvents`` it was given (``Metrics.cache_events(node)``; the cache itself knows
nothing of Prometheus). Gauges are read when scraped, from what ``watch`` was given:
the caches' ``snapshot()``, ``queue()`` and ``healthy``, and the ring's size.

====================================  ==========================================================
tfscache_requests_total               requests by protocol (grpc, rest), method and code (gRPC
                                      code name, or HTTP status for REST)
tfscache_cache_hits_total             acquires served by a resident model, per node
tfscache_cache_misses_total           acquires that had to wait for a load (or were refused)
tfscache_loads_total                  loads that finished, loaded or failed, per node
tfscache_load_failures_total          the loads of those that failed
tfscache_load_duration_seconds        histogram of successful loads (the reload that loaded them)
tfscache_room_wait_seconds            histogram of how long loads waited for room under the caps
tfscache_evictions_total              models taken off a node, by reason: capacity (a cap needed
                                      room), vanished (gone from the repository), node_lost (the
                                      node no longer served it after an outage), admin
                                      (CacheManager.evict) and drain (CacheManager.drain)
tfscache_unloads_total                unloads the node confirmed (END)
tfscache_resident_models              model versions in a node's config, by state: loading,
                                      available, unloading (all three series for every node,
                                      0 included; the sum over states is the old, unlabelled value)
tfscache_resident_bytes               their bytes, by state and kind: "measured" (RSS growth at
                                      load) or "estimated" (not measured yet: size on disk x factor)
tfscache_max_models                   a node's cap on model versions (cache.max_models_per_node;
                                      0 = none)
tfscache_memory_cap_bytes             a node's cap on their bytes (cache.memory_per_node;
                                      0 = none)
tfscache_leases_in_flight             requests holding a model on a node right now
tfscache_load_queue_depth             cold model versions waiting for their load
tfscache_node_healthy                 1 while a node's cache can load, else 0
tfscache_ring_nodes                   nodes (or sidecars) on the ring
tfscache_unloads_per_minute           a node's capacity unloads (a cap needed room) per minute over
                                      the last scale.window_s seconds (tfscache.scale)
tfscache_scale_advice                 +1 more nodes, 0 hold, -1 fewer: over this process's local
                                      nodes, by scale.* thresholds (tfscache.scale, docs/scaling.md)
====================================  ==========================================================

With ``per_model=True`` the per-event cache counters also carry a ``model`` label;
off by default, since thousands of models make thousands of series.

Reading the caps: a load is admitted only when it fits, and the victims that make room
for it turn ``unloading`` at that moment and stop counting. So the caps bound
``loading`` + ``available``; ``unloading`` versions are still in the node's memory, but on
their way out. The count cap holds while::

    sum without (state) (tfscache_resident_models{state!="unloading"}) <= tfscache_max_models

and the memory cap likewise with ``tfscache_resident_bytes`` (summed over ``kind`` too)
and ``tfscache_memory_cap_bytes``. The memory cap can be exceeded for a while when a load
measures above its estimate while every model is leased (docs/real-tfserving.md); the release
that leaves a model idle then unloads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from tfscache.cache.ledger import LOADING, READY, UNLOADING
from tfscache.scale import Advice, NodeLoad, UnloadRate, advise
from tfscache.settings import ScaleSection

Key = tuple[str, int]

LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ROOM_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


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


@dataclass(frozen=True)
class NodeView:
    """What the gauges read of one local node: its name, its cache (None while down), health."""

    name: str
    cache: Any  # a CacheManager, or None
    healthy: bool


class Metrics:
    """Every tfscache metric, in its own CollectorRegistry."""

    def __init__(self, *, per_model: bool = False, scale: ScaleSection | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_model = per_model
        self.scale = scale if scale is not None else ScaleSection()
        self.unload_rate = UnloadRate(self.scale.window_s, clock)
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["node", "model"] if per_model else ["node"]
        self.requests = Counter("tfscache_requests", "Requests by protocol, method and status code.",
                                ["protocol", "method", "code"], registry=r)
        self.hits = Counter("tfscache_cache_hits", "Requests whose model was resident.", labels, registry=r)
        self.misses = Counter("tfscache_cache_misses", "Requests that waited for a load or were refused one.",
                              labels, registry=r)
        self.loads = Counter("tfscache_loads", "Loads that finished (loaded or failed).", labels, registry=r)
        self.load_failures = Counter("tfscache_load_failures", "Loads that failed.", labels, registry=r)
        self.load_duration = Histogram("tfscache_load_duration_seconds", "Seconds a successful load took.",
                                       ["node"], buckets=LOAD_BUCKETS, registry=r)
        self.room_wait = Histogram("tfscache_room_wait_seconds", "Seconds a load waited for room under the caps.",
                                   ["node"], buckets=ROOM_BUCKETS, registry=r)
        self.evictions = Counter("tfscache_evictions", "Models taken off a node, by reason.",
                                 [*labels, "reason"], registry=r)
        self.unloads = Counter("tfscache_unloads", "Unloads the node confirmed.", ["node"], registry=r)
        self._nodes: Callable[[], Iterable[NodeView]] = lambda: ()
        self._ring_nodes: Callable[[], int] = lambda: 0
        r.register(_StateCollector(self))

    def watch(self, nodes: Callable[[], Iterable[NodeView]], ring_nodes: Callable[[], int]) -> None:
        """Where the gauges read from at scrape time."""
        self._nodes, self._ring_nodes = nodes, ring_nodes

    def nodes(self) -> list[NodeView]:
        return list(self._nodes())

    def ring_nodes(self) -> int:
        return self._ring_nodes()

    def cache_events(self, node: str) -> NodeEvents:
        """The observer to give node ``node``'s CacheManager (``events=``)."""
        return NodeEvents(self, node)

    def request(self, protocol: str, method: str, code: str) -> None:
        """Count one answered request (the front ends' error-mapping place calls this)."""
        self.requests.labels(protocol, method, code).inc()

    def node_loads(self, views: Iterable[NodeView] | None = None) -> list[NodeLoad]:
        """What the scale advice reads of each local node now (``views``; default: the watched ones)."""
        loads = []
        for view in self.nodes() if views is None else views:
            cache = view.cache
            counting = [m for m in cache.snapshot() if m.state != UNLOADING] if cache is not None else []
            count_cap, bytes_cap = caps(cache) if cache is not None else (0, 0)
            loads.append(NodeLoad(view.name, self.unload_rate.per_minute(view.name), len(counting),
                                  sum(m.bytes for m in counting), count_cap, bytes_cap,
                                  view.healthy and cache is not None))
        return loads

    def advice(self, loads: list[NodeLoad] | None = None) -> Advice:
        """The scale advice over ``loads`` (default: the local nodes now)."""
        return advise(self.node_loads() if loads is None else loads, self.scale)

    def hit_counts(self) -> tuple[int, int]:
        """(hits, misses) over every node and model."""
        return int(_total(self.hits)), int(_total(self.misses))


def _total(counter: Counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


class NodeEvents:
    """A CacheManager's observer (tfscache.cache.CacheEvents) that counts into Metrics."""

    def __init__(self, metrics: Metrics, node: str) -> None:
        self.metrics = metrics
        self.node = node

    def _labels(self, key: Key) -> tuple[str, ...]:
        return (self.node, key[0]) if self.metrics.per_model else (self.node,)

    def hit(self, key: Key) -> None:
        self.metrics.hits.labels(*self._labels(key)).inc()

    def miss(self, key: Key) -> None:
        self.metrics.misses.labels(*self._labels(key)).inc()

    def loaded(self, key: Key, seconds: float, size: int, measured: bool) -> None:
        self.metrics.loads.labels(*self._labels(key)).inc()
        self.metrics.load_duration.labels(self.node).observe(seconds)

    def load_failed(self, key: Key, seconds: float, error: Exception) -> None:
        self.metrics.loads.labels(*self._labels(key)).inc()
        self.metrics.load_failures.labels(*self._labels(key)).inc()

    def room_waited(self, key: Key, seconds: float) -> None:
        self.metrics.room_wait.labels(self.node).observe(seconds)

    def evicted(self, key: Key, reason: str, size: int) -> None:
        self.metrics.evictions.labels(*self._labels(key), reason).inc()
        if reason == "capacity":  # the scaling signal: room a cap needed (tfscache.scale)
            self.metrics.unload_rate.record(self.node)

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        self.metrics.unloads.labels(self.node).inc()


class _StateCollector:
    """The gauges, computed from the caches and the ring when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self):
        return []  # computed at collect time; nothing to check at registration

    def collect(self):
        models = GaugeMetricFamily("tfscache_resident_models",
                                   "Model versions in a node's config, by state (loading, available, unloading).",
                                   labels=["node", "state"])
        size = GaugeMetricFamily("tfscache_resident_bytes", "Bytes of the models in a node's config, by state.",
                                 labels=["node", "state", "kind"])
        max_models = GaugeMetricFamily("tfscache_max_models", "A node's cap on model versions (0 = none).",
                                       labels=["node"])
        memory_cap = GaugeMetricFamily("tfscache_memory_cap_bytes", "A node's cap on model bytes (0 = none).",
                                       labels=["node"])
        leases = GaugeMetricFamily("tfscache_leases_in_flight", "Requests holding a model on a node.",
                                   labels=["node"])
        queue = GaugeMetricFamily("tfscache_load_queue_depth", "Cold model versions waiting to load.",
                                  labels=["node"])
        healthy = GaugeMetricFamily("tfscache_node_healthy", "1 while the node's cache can load, else 0.",
                                    labels=["node"])
        for view in self._metrics.nodes():
            resident = list(view.cache.snapshot()) if view.cache is not None else []
            waiting = list(view.cache.queue()) if view.cache is not None else []
            for state, group in by_state(resident).items():
                models.add_metric([view.name, state], len(group))
                size.add_metric([view.name, state, "measured"], sum(m.bytes for m in group if m.measured))
                size.add_metric([view.name, state, "estimated"], sum(m.bytes for m in group if not m.measured))
            if view.cache is not None:  # a node that is down has no cache, and no caps to report
                count_cap, bytes_cap = caps(view.cache)
                max_models.add_metric([view.name], count_cap)
                memory_cap.add_metric([view.name], bytes_cap)
            leases.add_metric([view.name], sum(m.leases for m in resident))
            queue.add_metric([view.name], len(waiting))
            healthy.add_metric([view.name], 1 if view.healthy else 0)
        ring = GaugeMetricFamily("tfscache_ring_nodes", "Nodes (or sidecars) on the ring.",
                                 value=self._metrics.ring_nodes())
        return [models, size, max_models, memory_cap, leases, queue, healthy, ring, *self._scale()]

    def _scale(self) -> list[GaugeMetricFamily]:
        loads = self._metrics.node_loads()
        rate = GaugeMetricFamily("tfscache_unloads_per_minute",
                                 "A node's capacity unloads per minute over the last scale.window_s seconds.",
                                 labels=["node"])
        for load in loads:
            rate.add_metric([load.name], load.unloads_per_minute)
        advice = GaugeMetricFamily("tfscache_scale_advice", "+1 more nodes, 0 hold, -1 fewer (local nodes).",
                                   value=self._metrics.advice(loads).value)
        return [rate, advice]
