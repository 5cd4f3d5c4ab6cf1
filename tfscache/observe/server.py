"""The metrics port of ``tfscache serve``: ``/metrics`` (Prometheus), ``/status`` (JSON),
``/status/events`` (the timeline's JSON, tfscache.observe.timeline) and the status page at ``/``
(plain HTML, CSS and script from tfscache/observe/page, docs/status-page.md).

With ``server.admin_token`` set, ``/status`` and ``/status/events`` ask for it as the admin API
does (tfscache.auth): header ``Authorization: Bearer <token>``, else 401 with a JSON
``{"error": ...}`` and ``WWW-Authenticate: Bearer``. The page's own files carry no data and are
served to anyone (the page asks for the token when its JSON answers 401); ``/metrics`` stays open
for Prometheus.

An aiohttp server on the same event loop as the front ends. Both pages are computed
when asked, from the ``Metrics`` registry and from what the ``Topology`` holds now:
its backends (local nodes with their CacheManager, peer sidecars) and its ring.

``/status`` is the document ``tfscache status`` prints::

    {"time": 1767225600.0,                       # the server's wall clock
     "hits": 12, "misses": 3, "hit_ratio": 0.8,  # hit_ratio null before any request
     "ring": {"nodes": ["node0", "node1"], "replicas": 1},
     "nodes": [{"name": "node0", "kind": "node", "address": "127.0.0.1:40123", "healthy": true,
                "resident_models": 1, "resident_bytes": 240000, "leases": 0, "queue": [],
                "model_states": {"loading": {"models": 0, "bytes": 0},
                                 "available": {"models": 1, "bytes": 240000},
                                 "unloading": {"models": 0, "bytes": 0}},
                "caps": {"max_models": 2, "memory_bytes": 0},
                "models": [{"name": "a", "version": 1, "bytes": 240000, "measured": true,
                            "leases": 0, "last_use": 1767225599.5, "state": "available",
                            "pinned": false, "tier": "gpu", "moving": ""}]},
               {"name": "b", "kind": "peer", "address": "10.0.0.2:8500", "healthy": true}],
     "scale": {"advice": 0, "reason": "0.2 unloads per minute per node > 0", "window_s": 300.0,
               "unloads_per_minute": {"node0": 0.2}},
     "copies": {"min": 1, "max": 4, "models": {"a": ["node0", "node1"]}},   # with copies on
     "workers": [{"id": 0, "pid": 4242, "in_flight": 3, "restarts": 0, "delegations": 2,  # --workers N
                  "requests": 1200}]}

Per local node, ``gpu``: ``{"bytes", "cap_bytes"}``, the GPU bytes its models hold (learned at
their loads) against the GPU cap in force (0 = none; docs/gpu.md), null while the node is down.
Each model's ``tier`` is where it is resident, "gpu" or "host" (docs/tiers.md), and
``moving`` the tier it is moving to ("" when it is not).
With host-tier nodes (``--local-host-nodes``), each local node entry has its ``tier`` ("gpu",
"host"); the status page shows it.

Per local node, ``prefetch``: its co-access prefetch loads (started, completed, failed, used,
wasted; docs/prefetch.md), or null with prefetch off.

Per local node: ``resident_models`` and ``resident_bytes`` count the *available* versions
only (before issue 10 they counted loading and unloading ones too, so a node capped at 3
could show 5); ``model_states`` has every state apart, each key always present; ``models``
lists every version in the node's config with its ``state``. ``caps`` are the cache's caps
(0 = none; ``null`` while the node is down). The caps bound loading + available versions
(victims stop counting when they turn unloading; see tfscache.observe.metrics), so the count cap
holds while ``loading.models + available.models <= max_models``, and the memory cap
likewise with the bytes.

``scale`` is the scaling signal over the local nodes (tfscache.observe.scale, docs/scaling.md):
``advice`` +1 more nodes, 0 hold, -1 fewer, with its ``reason``; each local node's capacity
unloads per minute over the last ``window_s`` seconds (also in its entry, ``unloads_per_minute``).

``workers`` (``--workers N`` only; absent with one process): each worker process, from the
provider the control process sets (``metrics.exported.status``): its ``id``, ``pid``, requests
``in_flight`` on it now under its delegations, ``restarts`` (times a process under that id was
restarted), the ``delegations`` it holds (a count), and the ``requests`` its live process has
answered (from its last report; a restarted one counts from 0); a provider may add keys. ``hits``
and ``misses`` then
include the workers' counts (tfscache.observe.workermetrics).

``copies`` (copies that follow load on, docs/copies.md): each model that has extra copies
now, with every copy in ring order; every other model has its first ``min`` ring nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tfscache import errors
from tfscache.auth import BearerToken
from tfscache.frontend.backends import NodeBackend
from tfscache.observe.gauges import NodeView, by_state, caps
from tfscache.observe.metrics import Metrics
from tfscache.observe.prefetchmetrics import PrefetchCollector, prefetch_counts
from tfscache.cluster.topology import Topology
from tfscache.webserver import WebServer

log = logging.getLogger("tfscache.observe.server")


def watch(metrics: Metrics, topology: Topology) -> None:
    """Point the gauges at the topology's local nodes, ring and backends (read at every scrape; they
    change)."""
    metrics.watch(
        lambda: _node_views(topology),
        lambda: len(topology.ring.nodes),
        lambda: list(topology.backends),
    )
    metrics.registry.register(PrefetchCollector(lambda: _node_views(topology)))


def _node_views(topology: Topology) -> list[NodeView]:
    return [NodeView(b.name, b.cache, bool(b.healthy)) for b in topology.nodes()]


def status_document(metrics: Metrics, topology: Topology, tier=None, spread=None,
                    workers: Callable[[], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """What ``/status`` serves (see the module docstring); ``workers``: the control process's list of
    its worker processes (``--workers N``), absent with one process."""
    hits, misses = metrics.hit_counts()
    ring = topology.ring
    loads = metrics.node_loads(_node_views(topology))
    rates = {load.name: load.unloads_per_minute for load in loads}
    advice = metrics.advice(loads)
    nodes = []
    hosts = {b.name for b in topology.host_tier()}
    for backend in list(topology.backends.values()):
        local = isinstance(backend, NodeBackend)
        upstream = backend.upstream
        node: dict[str, Any] = {"name": backend.name, "kind": "node" if local else "peer",
                                "address": upstream.grpc_address if upstream is not None else None,
                                "healthy": bool(backend.healthy)}
        if local:
            node.update(_local_node(backend.cache), unloads_per_minute=rates.get(backend.name, 0.0))
            if hosts:  # host-tier nodes (docs/tiers.md): each local node's tier
                node["tier"] = "host" if backend.name in hosts else "gpu"
        nodes.append(node)
    document = {
        "time": time.time(),
        "hits": hits,
        "misses": misses,
        "hit_ratio": hits / (hits + misses) if hits + misses else None,
        "ring": {"nodes": ring.nodes, "replicas": ring.replicas},
        "nodes": nodes,
        "scale": {
            "advice": advice.value,
            "reason": advice.reason,
            "window_s": metrics.unload_rate.window_s,
            "unloads_per_minute": rates,
        },
    }
    # a bucket's repository: {"url", "directory", "bytes", "cap_bytes", "versions", ...}
    if tier is not None:
        document["disk_tier"] = tier.describe()
    if spread is not None:  # copies that follow load (tfscache.cluster.spread)
        document["copies"] = {"min": spread.rule.min_copies, "max": spread.rule.max_copies,
                              "models": spread.counts()}
    if workers is not None:  # --workers N: one entry per worker process (tfscache.workers)
        document["workers"] = [
            {**_worker(w), "requests": int(metrics.exported.counted(w["id"], REQUESTS))}
            for w in workers()
        ]
    return document


REQUESTS = "tfscache_requests_total"


def _worker(entry: dict[str, Any]) -> dict[str, Any]:
    """A worker's entry with id, pid, in_flight, restarts and delegations (a list of them is counted)."""
    delegations = entry.get("delegations", 0)
    return {
        **entry,
        "id": entry["id"],
        "pid": entry.get("pid"),
        "in_flight": int(entry.get("in_flight", 0)),
        "restarts": int(entry.get("restarts", 0)),
        "delegations": delegations if isinstance(delegations, int) else len(delegations),
    }


def _local_node(cache) -> dict[str, Any]:
    """The keys of a local node's entry: its models by state, caps, leases and queue."""
    resident = list(cache.snapshot()) if cache is not None else []
    states = {state: {"models": len(group), "bytes": sum(m.bytes for m in group)}
              for state, group in by_state(resident).items()}
    limits = None  # unknown while the node is down
    if cache is not None:
        count_cap, bytes_cap = caps(cache)
        limits = {"max_models": count_cap, "memory_bytes": bytes_cap}
    models = [dataclasses.asdict(m) for m in resident]
    return {
        "resident_models": states["available"]["models"],
        "resident_bytes": states["available"]["bytes"],
        "leases": sum(m.leases for m in resident),
        "queue": [dataclasses.asdict(q) for q in cache.queue()] if cache is not None else [],
        "model_states": states,
        "caps": limits,
        "prefetch": prefetch_counts(cache),
        "gpu": _gpu(cache),
        "models": sorted(models, key=lambda m: (m["name"], m["version"])),
    }


def _gpu(cache) -> dict[str, int] | None:
    """A node's GPU bytes against its GPU cap (docs/gpu.md); null while the node is down."""
    if cache is None:
        return None
    used, cap = cache.gpu_usage()
    return {"bytes": used, "cap_bytes": cap}


PAGE = Path(__file__).resolve().parent / "page"
PAGE_FILES = {"/": ("index.html", "text/html"), "/page.css": ("page.css", "text/css"),
              "/page.js": ("page.js", "text/javascript")}


class ObserveServer(WebServer):
    """``/metrics``, ``/status``, ``/status/events`` and the status page on their own port;
    ``start()`` returns the bound port. ``token``: ``server.admin_token`` ("" = none)."""

    what = "metrics and status"

    def __init__(self, metrics: Metrics, topology: Topology, *, bind_address: str, port: int,
                 tier=None, spread=None, token: str = "") -> None:
        super().__init__(bind_address, port)
        self._spread = spread  # tfscache.cluster.spread.Spread when copies follow load, else None
        self.metrics = metrics
        self._topology = topology
        self._tier = tier  # tfscache.storage.tier.DiskTier of a bucket's repository, else None
        self._token = BearerToken(token)

    def web_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/status/events", self._events)
        for route in PAGE_FILES:
            app.router.add_get(route, self._page)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.exported)  # on the loop: the gauges read the caches
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _refused(self, request: web.Request) -> web.Response | None:
        """The 401 of a JSON request without the admin token (None: it may pass)."""
        try:
            self._token.check(request.headers.get("Authorization"), "header")
        except errors.TfscacheError as exc:
            return web.json_response({"error": exc.message}, status=exc.http_status,
                                     headers={"WWW-Authenticate": "Bearer"})
        return None

    async def _status(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.json_response(
            status_document(
                self.metrics, self._topology, self._tier, self._spread, self.metrics.exported.status
            )
        )

    async def _events(self, request: web.Request) -> web.Response:
        """The timeline after ``?since=SEQ`` (default 0: every kept event)."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        raw = request.query.get("since", "0")
        if not (raw.isascii() and raw.isdigit()):
            return web.json_response(
                {"error": f"since must be a sequence number (an integer >= 0), got {raw!r}"},
                status=400)
        return web.json_response(self.metrics.timeline.since(int(raw)))

    async def _page(self, request: web.Request) -> web.Response:
        name, content_type = PAGE_FILES[request.path]
        body = await asyncio.to_thread((PAGE / name).read_bytes)  # never block the loop on disk
        return web.Response(body=body, content_type=content_type, charset="utf-8",
                            headers={"Cache-Control": "no-cache"})
