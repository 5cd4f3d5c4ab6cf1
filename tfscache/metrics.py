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
tfscache_resident_models              model versions in a node's config (loading, available and
                                      unloading: each counts against the caps)
tfscache_resident_bytes               their bytes, kind="measured" (RSS growth at load) or
                                      kind="estimated" (not measured yet: size on disk x factor)
tfscache_leases_in_flight             requests holding a model on a node right now
tfscache_load_queue_depth             cold model versions waiting for their load
tfscache_node_healthy                 1 while a node's cache can load, else 0
tfscache_ring_nodes                   nodes (or sidecars) on the ring
====================================  ==========================================================

With ``per_model=True`` the per-event cache counters also carry a ``model`` label;
off by default, since thousands of models make thousands of series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

Key = tuple[str, int]

LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ROOM_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class NodeView:
    """What the gauges read of one local node: its name, its cache (None while down), health."""

    name: str
    cache: Any  # a CacheManager, or None
    healthy: bool


class Metrics:
    """Every tfscache metric, in its own CollectorRegistry."""

    def __init__(self, *, per_model: bool = False) -> None:
        self.per_model = per_model
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

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        self.metrics.unloads.labels(self.node).inc()


class _StateCollector:
    """The gauges, computed from the caches and the ring when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self):
        return []  # computed at collect time; nothing to check at registration

    def collect(self):
        models = GaugeMetricFamily("tfscache_resident_models", "Model versions in a node's config.",
                                   labels=["node"])
        size = GaugeMetricFamily("tfscache_resident_bytes", "Bytes of the models in a node's config.",
                                 labels=["node", "kind"])
        leases = GaugeMetricFamily("tfscache_leases_in_flight", "Requests holding a model on a node.",
                                   labels=["node"])
        queue = GaugeMetricFamily("tfscache_load_queue_depth", "Cold model versions waiting to load.",
                                  labels=["node"])
        healthy = GaugeMetricFamily("tfscache_node_healthy", "1 while the node's cache can load, else 0.",
                                    labels=["node"])
        for view in self._metrics.nodes():
            resident = list(view.cache.snapshot()) if view.cache is not None else []
            waiting = list(view.cache.queue()) if view.cache is not None else []
            models.add_metric([view.name], len(resident))
            size.add_metric([view.name, "measured"], sum(m.bytes for m in resident if m.measured))
            size.add_metric([view.name, "estimated"], sum(m.bytes for m in resident if not m.measured))
            leases.add_metric([view.name], sum(m.leases for m in resident))
            queue.add_metric([view.name], len(waiting))
            healthy.add_metric([view.name], 1 if view.healthy else 0)
        ring = GaugeMetricFamily("tfscache_ring_nodes", "Nodes (or sidecars) on the ring.",
                                 value=self._metrics.ring_nodes())
        return [models, size, leases, queue, healthy, ring]
