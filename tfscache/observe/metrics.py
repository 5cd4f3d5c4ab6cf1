"""Prometheus metrics of one ``tfscache serve``: one registry per process (per ``Metrics``).

Counters and histograms move with events: the front ends time and count requests
(``begin``, ``request``), the router counts forwards and retries, and each node's
CacheManager reports hits, loads, evictions through the ``NodeEvents`` it was given
(``Metrics.cache_events(node)``; the cache itself knows nothing of Prometheus). Gauges
are read when scraped (tfscache.observe.gauges), from what ``watch`` was given: the caches'
``snapshot()``, ``queue()`` and ``healthy``, the ring and its backends. Every metric,
with its labels, the dashboard and the alerts over them: docs/metrics.md.

======================================  ========================================================
tfscache_requests_total                 requests by protocol (grpc, rest), method and code (gRPC
                                        code name, or HTTP status for REST)
tfscache_request_duration_seconds       histogram of the same requests' latency, same labels
                                        (+ model with per_model), 1 ms .. 60 s
tfscache_cache_hits_total               acquires served by a resident model, per node
tfscache_cache_misses_total             acquires that had to wait for a load (or were refused)
tfscache_loads_total                    loads that finished, loaded or failed, per node
tfscache_load_failures_total            the loads of those that failed
tfscache_load_duration_seconds          histogram of successful loads (the reload that loaded them)
tfscache_unload_duration_seconds        histogram of unloads, config out to the node's END
tfscache_room_wait_seconds              histogram of how long cold loads waited in the load queue
                                        for room under the caps
tfscache_evictions_total                models taken off a node, by reason: capacity (a cap needed
                                        room), vanished (gone from the repository), node_lost (the
                                        node no longer served it after an outage), admin
                                        (CacheManager.evict) and drain (CacheManager.drain)
tfscache_unloads_total                  unloads the node confirmed (END)
tfscache_node_restarts_total            times a local node process exited and was restarted
tfscache_forwards_total                 requests sent on to a peer sidecar, by peer (``node``)
tfscache_retries_total                  tries that failed UNAVAILABLE/CANCELLED on a node or peer
tfscache_dataplane_routed_total         warm requests HAProxy sent straight to a node (or a peer
                                        sidecar: also a forward), by node
                                        (server.data_plane = haproxy; 0 without it)
tfscache_dataplane_response_seconds     HAProxy's mean response time over the last 1,024 requests
                                        it routed to a node (or peer), by node and protocol (grpc,
                                        rest): the per-node latency when routed requests are counted
                                        only (server.routed_requests = counted)
tfscache_resident_models                model versions in a node's config, by state: loading,
                                        available, unloading (all three series for every node,
                                        0 included; the sum over states is the old, unlabelled value)
tfscache_resident_bytes                 their bytes, by state and kind: "measured" (RSS growth at
                                        load) or "estimated" (not measured yet: size on disk x factor)
tfscache_cap_models                     a node's cap on model versions (cache.max_models_per_node;
                                        0 = none); was tfscache_max_models
tfscache_cap_bytes                      a node's cap on their bytes (cache.memory_per_node;
                                        0 = none); was tfscache_memory_cap_bytes
tfscache_used_models                    model versions that count against the cap (loading and
                                        available)
tfscache_used_bytes                     their bytes
tfscache_lru_idle_age_seconds           age of the least recently used idle model (available, no
                                        lease, not pinned); absent while none is idle
tfscache_leases_in_flight               requests holding a model on a node right now
tfscache_load_queue_depth               cold model versions waiting for their load
tfscache_node_healthy                   1 while a node's cache can load, else 0
tfscache_ring_nodes                     nodes (or sidecars) on the ring
tfscache_unloads_per_minute             a node's capacity unloads (a cap needed room) per minute over
                                        the last scale.window_s seconds (tfscache.observe.scale)
tfscache_scale_advice                   +1 more nodes, 0 hold, -1 fewer: over this process's local
                                        nodes, by scale.* thresholds (tfscache.observe.scale, docs/scaling.md)
tfscache_build_info                     1, labelled with the version and the Python version
process_*, python_info                  prometheus_client's process and platform collectors
======================================  ========================================================

No ``_created`` series are exported (``disable_created_metrics``). With ``per_model=True``
the per-event cache counters, the load, unload and room-wait histograms and the request
latency histogram also carry a ``model`` label; off by default, since thousands of models
make thousands of series.

Reading the caps: a load is admitted only when it fits, and the victims that make room
for it turn ``unloading`` at that moment and stop counting. So the caps bound
``loading`` + ``available``, which ``tfscache_used_models`` and ``tfscache_used_bytes``
report; ``unloading`` versions are still in the node's memory, but on their way out::

    tfscache_used_models <= tfscache_cap_models      (when the cap is not 0)

The memory cap can be exceeded for a while when a load measures above its estimate while
every model is leased (docs/real-tfserving.md); the release that leaves a model idle then
unloads it.

A ``RequestLog`` (``tfscache serve --request-log``) given to ``Metrics`` gets one row per
request that took a lease on a local node, at the end of the request, with the load
seconds and bytes last measured for its model (tfscache.observe.requestlog).

``Metrics.timeline`` keeps the last few hundred loads, failed loads, evictions and unloads the
nodes reported, for the status page (tfscache.observe.timeline, docs/status-page.md).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily

from tfscache import __version__, logs
from tfscache.observe import requestlog
from tfscache.cache.ledger import UNLOADING
from tfscache.observe.gauges import STATES, NodeView, Sources, StateCollector, by_state, caps
from tfscache.observe.scale import Advice, NodeLoad, UnloadRate, advise
from tfscache.observe.timeline import Timeline
from tfscache.observe.workermetrics import WorkerMetrics
from tfscache.settings import ScaleSection

__all__ = ["STATES", "Metrics", "NodeEvents", "NodeView", "by_state", "caps"]

Key = tuple[str, int]

REQUEST_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ROOM_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# no *_created series: process-wide in prometheus_client, and wanted everywhere
disable_created_metrics()


class Metrics:
    """Every tfscache metric, in its own CollectorRegistry."""

    def __init__(
        self,
        *,
        per_model: bool = False,
        scale: ScaleSection | None = None,
        clock: Callable[[], float] = time.monotonic,
        request_log: requestlog.RequestLog | None = None,
        process: bool = True,
    ) -> None:
        """``process``: also export prometheus_client's process_* and python_info (one per process)."""
        self.per_model = per_model
        self.scale = scale if scale is not None else ScaleSection()
        self.unload_rate = UnloadRate(self.scale.window_s, clock)
        self.request_log = request_log
        # the last few hundred loads, unloads, evictions and failures (the status page's timeline)
        self.timeline = Timeline()
        # (node, key) -> last load's (seconds, bytes)
        self.costs: dict[tuple[str, Key], tuple[float, int]] = {}
        # requests counted so far (a worker's snapshots skip when it did not move)
        self.answered = 0
        self.counts: dict[str, dict[str, int]] = {
            "tfscache_node_restarts": {},
            "tfscache_forwards": {},
            "tfscache_retries": {},
            "tfscache_dataplane_routed": {},
        }
        # Label children bound once per label set, so a request's accounting looks up no labels:
        # (protocol, method, code, model or None) -> (requests counter, latency histogram).
        self._request_children: dict[tuple[str, str, str, str | None], tuple] = {}
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["node", "model"] if per_model else ["node"]
        request_labels = (
            ["protocol", "method", "code", "model"] if per_model else ["protocol", "method", "code"]
        )
        self.requests = Counter(
            "tfscache_requests",
            "Requests by protocol, method and status code.",
            ["protocol", "method", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "tfscache_request_duration_seconds",
            "Seconds from a request's arrival to its answer, by protocol, method and code.",
            request_labels,
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.hits = Counter(
            "tfscache_cache_hits", "Requests whose model was resident.", labels, registry=r
        )
        self.misses = Counter(
            "tfscache_cache_misses",
            "Requests that waited for a load or were refused one.",
            labels,
            registry=r,
        )
        self.loads = Counter(
            "tfscache_loads", "Loads that finished (loaded or failed).", labels, registry=r
        )
        self.load_failures = Counter(
            "tfscache_load_failures", "Loads that failed.", labels, registry=r
        )
        self.load_duration = Histogram(
            "tfscache_load_duration_seconds",
            "Seconds a successful load took.",
            labels,
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.unload_duration = Histogram(
            "tfscache_unload_duration_seconds",
            "Seconds from a model leaving the node's config to the node's END.",
            labels,
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.room_wait = Histogram(
            "tfscache_room_wait_seconds",
            "Seconds a cold load waited in the load queue for room under the caps.",
            labels,
            buckets=ROOM_BUCKETS,
            registry=r,
        )
        self.dataplane_response = Gauge(
            "tfscache_dataplane_response_seconds",
            "HAProxy's mean response time over the last 1,024 requests it routed to a node or "
            "peer, by protocol (server.data_plane = haproxy).",
            ["node", "protocol"],
            registry=r,
        )
        self.evictions = Counter("tfscache_evictions", "Models taken off a node, by reason.",
                                 [*labels, "reason"], registry=r)
        self.unloads = Counter(
            "tfscache_unloads", "Unloads the node confirmed.", ["node"], registry=r
        )
        # cache.demote = host (docs/tiers.md): "to" is host (a demotion) or gpu (a promotion)
        self.moves = Counter("tfscache_tier_moves", "Models moved between the GPU and host tiers.",
                             [*labels, "to"], registry=r)
        self.move_failures = Counter(
            "tfscache_tier_move_failures", "Moves between tiers that failed (the model stayed).",
            [*labels, "to"], registry=r)
        self.move_duration = Histogram(
            "tfscache_tier_move_duration_seconds", "Seconds a move between tiers took.",
            [*labels, "to"], buckets=LOAD_BUCKETS, registry=r)
        Info("tfscache_build", "The tfscache version and the Python it runs on.", registry=r).info(
            {"version": __version__, "python": platform.python_version()})
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        self._sources = Sources(lambda: (), lambda: 0, lambda: ())
        r.register(StateCollector(lambda: self._sources, lambda: self.counts))
        r.register(_ScaleCollector(self))
        # What /metrics exports: this registry, plus the workers' counts with ``--workers N``
        # (the control process feeds it their reports: tfscache.observe.workermetrics).
        self.exported = WorkerMetrics(r)

    def watch(self, nodes: Callable[[], Iterable[NodeView]], ring_nodes: Callable[[], int],
              backends: Callable[[], Iterable[str]] | None = None) -> None:
        """Where the gauges read from at scrape time: local nodes, the ring's size, every backend's
        name (default: the local nodes')."""
        if backends is None:
            backends = lambda: [view.name for view in nodes()]  # noqa: E731
        self._sources = Sources(nodes, ring_nodes, backends)

    def nodes(self) -> list[NodeView]:
        return list(self._sources.nodes())

    def ring_nodes(self) -> int:
        return self._sources.ring_nodes()

    def cache_events(self, node: str) -> NodeEvents:
        """The observer to give node ``node``'s CacheManager (``events=``)."""
        return NodeEvents(self, node)

    def begin(self) -> float:
        """A request arrives (the front ends call this first): its start, for ``request``."""
        if self.request_log is not None:
            requestlog.forget()
        return time.perf_counter()

    def request(self, protocol: str, method: str, code: str, started: float | None = None) -> None:
        """Count one answered request (the front ends' error-mapping place calls this); with ``started``
        (``begin``'s) also its latency, and its row in the request log (when one is written)."""
        children = self._children(protocol, method, code, logs.model.get() or "")
        children[0].inc()
        self.answered += 1
        if started is None:
            return
        seconds = time.perf_counter() - started
        children[1].observe(seconds)
        if self.request_log is not None:
            self.log_row(code, seconds)

    def routed_request(self, request, node: str, version: int | None) -> None:
        """Count one request HAProxy routed straight to ``node`` (tfscache.dataplane.requests's
        ``Routed``), as ``request`` counts one the front end answered: its method, code and
        latency, and its row in the request log (warm: it found its route). ``version`` None: a
        peer sidecar served it, and the request log has no row, as for a request the router
        forwarded (a row is a lease taken on a local node)."""
        children = self._children(request.protocol, request.method, request.code, request.model)
        children[0].inc()
        children[1].observe(request.seconds)
        self.answered += 1
        if self.request_log is not None and version is not None:
            self._write_row(request.time, request.model, version, node, False, request.code,
                            False)

    def _children(self, protocol: str, method: str, code: str, model: str) -> tuple:
        """The request counter's and latency histogram's series for these labels."""
        labels = (protocol, method, code, model if self.per_model else None)
        children = self._request_children.get(labels)
        if children is None:
            children = self._request_children[labels] = (
                self.requests.labels(protocol, method, code),
                (
                    self.latency.labels(*labels)
                    if self.per_model
                    else self.latency.labels(protocol, method, code)
                ),
            )
        return children

    def log_row(self, code: str, seconds: float) -> None:
        """The request log's row of the request ending now (``seconds`` after it arrived), if it
        took a lease on a local node (``requestlog.served`` in its task)."""
        served = requestlog.current()
        if served is not None and self.request_log is not None:
            self._write_row(time.time() - seconds, served.name, served.version, served.node,
                            served.cold, code, served.prefetched)

    def _write_row(self, arrived: float, name: str, version: int, node: str, cold: bool,
                   code: str, prefetched: bool) -> None:
        load_s, size = self.costs.get((node, (name, version)), (0.0, 0))
        self.request_log.write(
            {
                "time": round(arrived, 6),
                "model": name,
                "version": version,
                "load_seconds": round(load_s, 6),
                "bytes": size,
                "node": node,
                "cold": int(cold),
                "code": code,
                "prefetched": int(prefetched),
            }
        )

    def rows_only(self) -> RowsOnly:
        """The accounting for front ends whose requests another process counts: the control
        process's internal listeners with ``--workers N`` (the worker that received a request
        counts it; the control process, which served it, writes its request-log row)."""
        return RowsOnly(self)

    def count(self, family: str, node: str) -> None:
        """One more node restart, forward or retry (``tfscache_node_restarts``, ``tfscache_forwards``,
        ``tfscache_retries``) for ``node``."""
        seen = self.counts[family]
        seen[node] = seen.get(node, 0) + 1

    def forwarded(self, node: str) -> None:
        self.count("tfscache_forwards", node)

    def retried(self, node: str) -> None:
        self.count("tfscache_retries", node)

    def routed(self, node: str, requests: int, peer: bool = False) -> None:
        """``requests`` more warm requests HAProxy sent straight to ``node`` (docs/data-plane.md);
        ``peer``: a peer sidecar, so they are forwards too, as the router counts its own."""
        for family in ("tfscache_dataplane_routed", "tfscache_forwards") if peer else (
                "tfscache_dataplane_routed",):
            seen = self.counts[family]
            seen[node] = seen.get(node, 0) + requests

    def routed_response(self, node: str, protocol: str, seconds: float) -> None:
        """HAProxy's mean response time of the requests it routed to ``node`` lately (its
        ``show stat`` rtime), for ``protocol`` (grpc, rest)."""
        self.dataplane_response.labels(node, protocol).set(seconds)

    def node_restarted(self, node: str) -> None:
        self.count("tfscache_node_restarts", node)

    def node_loads(self, views: Iterable[NodeView] | None = None) -> list[NodeLoad]:
        """What the scale advice reads of each local node now (``views``; default: the watched ones)."""
        loads = []
        for view in self.nodes() if views is None else views:
            cache = view.cache
            counting = (
                [m for m in cache.snapshot() if m.state != UNLOADING] if cache is not None else []
            )
            count_cap, bytes_cap = caps(cache) if cache is not None else (0, 0)
            loads.append(NodeLoad(view.name, self.unload_rate.per_minute(view.name), len(counting),
                                  sum(m.bytes for m in counting), count_cap, bytes_cap,
                                  view.healthy and cache is not None))
        return loads

    def advice(self, loads: list[NodeLoad] | None = None) -> Advice:
        """The scale advice over ``loads`` (default: the local nodes now)."""
        return advise(self.node_loads() if loads is None else loads, self.scale)

    def hit_counts(self) -> tuple[int, int]:
        """(hits, misses) over every node and model, the workers' counts included."""
        if self.exported.merging:
            return (int(self.exported.total("tfscache_cache_hits_total")),
                    int(self.exported.total("tfscache_cache_misses_total")))
        return int(_total(self.hits)), int(_total(self.misses))


def _total(counter: Counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


class RowsOnly:
    """A front end's accounting that counts nothing and writes request-log rows (``Metrics.rows_only``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def begin(self) -> float:
        return self._metrics.begin()

    def request(self, protocol: str, method: str, code: str, started: float | None = None) -> None:
        if started is not None and self._metrics.request_log is not None:
            self._metrics.log_row(code, time.perf_counter() - started)


class NodeEvents:
    """A CacheManager's observer (tfscache.cache.CacheEvents) that counts into Metrics."""

    def __init__(self, metrics: Metrics, node: str) -> None:
        self.metrics = metrics
        self.node = node
        self._hits: dict[str, object] = {}  # model ("" without per_model) -> its bound hit counter

    def _labels(self, key: Key) -> tuple[str, ...]:
        return (self.node, key[0]) if self.metrics.per_model else (self.node,)

    def hit(self, key: Key) -> None:
        """A warm acquire (every request's path): a bound counter, the request log only when written."""
        model = key[0] if self.metrics.per_model else ""
        counter = self._hits.get(model)
        if counter is None:
            counter = self._hits[model] = self.metrics.hits.labels(*self._labels(key))
        counter.inc()
        if self.metrics.request_log is not None:
            requestlog.served(self.node, key, cold=False)  # runs in the request's task

    def miss(self, key: Key) -> None:
        self.metrics.misses.labels(*self._labels(key)).inc()
        if self.metrics.request_log is not None:
            requestlog.served(self.node, key, cold=True)

    def prefetch_used(self, key: Key) -> None:
        if self.metrics.request_log is not None:
            requestlog.prefetched()  # runs in the request's task, after hit or miss

    def loaded(self, key: Key, seconds: float, size: int, measured: bool) -> None:
        self.metrics.loads.labels(*self._labels(key)).inc()
        self.metrics.load_duration.labels(*self._labels(key)).observe(seconds)
        self.metrics.timeline.record(self.node, "loaded", *key, size=size, seconds=seconds)
        if self.metrics.request_log is not None:
            self.metrics.costs[(self.node, key)] = (seconds, size)

    def load_failed(self, key: Key, seconds: float, error: Exception) -> None:
        self.metrics.loads.labels(*self._labels(key)).inc()
        self.metrics.load_failures.labels(*self._labels(key)).inc()
        self.metrics.timeline.record(self.node, "load_failed", *key, reason=str(error)[:500],
                                     seconds=seconds)

    def room_waited(self, key: Key, seconds: float) -> None:
        self.metrics.room_wait.labels(*self._labels(key)).observe(seconds)

    def evicted(self, key: Key, reason: str, size: int) -> None:
        self.metrics.evictions.labels(*self._labels(key), reason).inc()
        self.metrics.timeline.record(self.node, "evicted", *key, reason=reason, size=size)
        if reason == "capacity":  # the scaling signal: room a cap needed (tfscache.observe.scale)
            self.metrics.unload_rate.record(self.node)

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        self.metrics.unloads.labels(self.node).inc()
        self.metrics.unload_duration.labels(*self._labels(key)).observe(seconds)
        self.metrics.timeline.record(self.node, "unloaded", *key, size=size, seconds=seconds)

    def moved(self, key: Key, tier: str, seconds: float) -> None:
        self.metrics.moves.labels(*self._labels(key), tier).inc()
        self.metrics.move_duration.labels(*self._labels(key), tier).observe(seconds)
        self.metrics.timeline.record(self.node, "demoted" if tier == "host" else "promoted", *key,
                                     seconds=seconds)

    def move_failed(self, key: Key, tier: str, error: Exception) -> None:
        self.metrics.move_failures.labels(*self._labels(key), tier).inc()
        self.metrics.timeline.record(self.node, "move_failed", *key, reason=str(error)[:500])


class _ScaleCollector:
    """The scaling signal's gauges (tfscache.observe.scale), computed when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self):
        return []  # computed at collect time; nothing to check at registration

    def collect(self):
        loads = self._metrics.node_loads()
        rate = GaugeMetricFamily(
            "tfscache_unloads_per_minute",
            "A node's capacity unloads per minute over the last scale.window_s seconds.",
            labels=["node"],
        )
        for load in loads:
            rate.add_metric([load.name], load.unloads_per_minute)
        advice = GaugeMetricFamily(
            "tfscache_scale_advice",
            "+1 more nodes, 0 hold, -1 fewer (local nodes).",
            value=self._metrics.advice(loads).value,
        )
        return [rate, advice]
