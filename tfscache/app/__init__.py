"""`tfscache serve`: front ends speaking a model server's own API (TF Serving's, or Triton's
Open Inference Protocol: ``node.backend``, tfscache.kinds.table) over a ring of nodes, embedded
(``--local-nodes K`` children, one CacheManager each) or sidecar (``--node-address``: one node;
a request for a model another sidecar owns is forwarded to it, one hop, marked).

``ServeApp`` is the whole process minus argument parsing and signals, so tests can run it
in-process. It builds its parts, each given what it needs, and alone orders their start-up and
shutdown: host.py (state directory, model repository, GPU cap), credentials.py ([tls]),
hops.py (the HTTP session, upstreams, peer backends), nodes.py (node processes and their
caches), routing.py (router, copies), membership.py (discovery, sidecar mode), frontends.py
(gRPC, REST, workers' public ports), telemetry.py (metrics, request log, metrics port); admin
(health, admin port, drains) is tfscache.admin's ``Lifecycle``. Nothing here imports
tensorflow or tritonclient.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from tfscache.admin.lifecycle import Lifecycle
from tfscache.admin.operations import AdminOperations
from tfscache.app.credentials import Credentials
from tfscache.app.frontends import Frontends
from tfscache.app.hops import Hops
from tfscache.app.host import GpuCap, ModelSource, StateDir
from tfscache.app.membership import Membership, in_ring_at_start
from tfscache.app.nodes import Nodes
from tfscache.app.telemetry import Telemetry
from tfscache.app.routing import Routing, spread_from
from tfscache.cluster.topology import Topology
from tfscache.dataplane.control import DataPlane
from tfscache.discovery import Discovery, Peer
from tfscache.frontend.tiers import TakeHandler
from tfscache.kinds.supervisor import Supervisor
from tfscache.kinds.table import KINDS
from tfscache.settings import Settings
from tfscache.tls import ServerTls
from tfscache.workers.control import WorkerPool

log = logging.getLogger("tfscache.app")


class ServeApp:
    """Front ends, router, caches and (embedded) node children of one `tfscache serve`."""

    def __init__(self, settings: Settings, config_file: str | None = None) -> None:
        s = settings
        self.settings = settings
        self.config_file = config_file  # the static discovery backend re-reads it on SIGHUP
        self.kind = KINDS[s.node.backend]  # the node kind: children, client, adapter, protocol
        self.protocol = self.kind.part("protocol")  # the API the front ends speak
        self.grpc_port: int | None = None
        self.rest_port: int | None = None
        self.admin_port: int | None = None
        self.failed = asyncio.Event()  # set when the process cannot go on (its node never came up)
        self.failure = ""
        self._state = StateDir(s)
        self._models = ModelSource(s)  # a bucket's is opened in start(), in the state directory
        self._gpu = GpuCap(s.cache.gpu_memory_per_node)
        # with the haproxy data plane, HAProxy holds the public ports' certificate (reload_tls)
        self._credentials = Credentials(s.tls, s.sidecar,
                                        front_ends=s.server.data_plane != "haproxy")
        # Copies that follow load (docs/copies.md): None keeps fixed replicas.
        self.spread = spread_from(s)
        own = (s.ring.self_name or "local") if s.sidecar else None
        on_load = (self.spread.copies.report if self.spread is not None and s.copies.peer_reports
                   else None)
        self._hops = Hops(s.server, self._credentials, own, on_load=on_load)
        # Backends, ring, joined and drained nodes; every change goes through it. Sidecar mode:
        # its own node is on its ring as membership.in_ring_at_start says, else once joined.
        self.topology = Topology(replicas=s.ring.replicas_per_model, vnodes=s.ring.vnodes, own=own,
                                 in_ring=in_ring_at_start(s.discovery), make_peer=self._hops.peer,
                                 retire_grace_s=s.cache.load_timeout_s,
                                 own_tier=s.node.node_tier)
        self._telemetry = Telemetry(s, self.topology)
        self.metrics = self._telemetry.metrics
        self._routing = Routing(self.topology, self.spread, self.metrics,
                                wait_s=s.cache.load_timeout_s, per_model=s.server.metrics_per_model)
        self._membership = Membership(s, config_file, self.topology)
        self.lifecycle: Lifecycle | None = None  # health on the gRPC port, admin server, drains
        # server.workers > 1: worker processes serve the public ports; the front ends here are
        # internal.
        self.workers = WorkerPool(s, nodes=lambda: {n.name: n for n in self.topology.nodes()},
                                  router=lambda: self.router,
                                  health=lambda: self.lifecycle and self.lifecycle.health,
                                  spread=self.spread, metrics=self.metrics) \
            if s.server.workers > 1 else None
        # server.data_plane = haproxy: HAProxy answers the public ports, warm requests go from
        # it straight to their node, the front ends here are its fallback (docs/data-plane.md).
        self.dataplane = DataPlane(s, nodes=lambda: {n.name: n for n in self.topology.nodes()},
                                   router=lambda: self.router, spread=self.spread,
                                   rules=self.protocol.data_plane,
                                   routed=self.metrics.routed,
                                   answered=self.metrics.routed_request
                                   if s.server.routed_requests == "logged" else None,
                                   peers=self.topology.peers if s.sidecar else None,
                                   forwarded_as=own,
                                   timed=self.metrics.routed_response) \
            if s.server.data_plane == "haproxy" else None
        self._frontends = Frontends(s.server, protocol=self.protocol, metrics=self.metrics,
                                    credentials=self._credentials, workers=self.workers,
                                    dataplane=self.dataplane)
        self._nodes: Nodes | None = None  # built in start(), once the state directory is known

    # -- what tests, the CLI and the admin server read ----------------------------------------

    @property
    def backends(self):
        """Every backend by ring name (``Topology.backends``; read-only)."""
        return self.topology.backends

    @property
    def router(self):
        return self._routing.router

    @property
    def repository(self):
        return self._models.repository

    @property
    def state_dir(self) -> Path | None:
        return self._state.path

    @property
    def discovery(self) -> Discovery | None:
        """Sidecar mode, from start() until stop(); SIGHUP's ``reload()`` goes to it."""
        return self._membership.discovery

    @property
    def joined(self) -> bool:
        return self._membership.joined

    @property
    def supervisor(self) -> Supervisor | None:
        return self._nodes.supervisor if self._nodes is not None else None

    @property
    def tls(self) -> ServerTls | None:
        """[tls]: the front ends' certificate (reload_tls re-reads it); None with the haproxy
        data plane, whose HAProxy serves it (``dataplane.reload_tls``)."""
        return self._credentials.server

    @property
    def gpu_cap(self) -> int:
        """The GPU memory cap in force (0: none, or no GPU to measure it)."""
        return self._gpu.cap

    @property
    def metrics_port(self) -> int | None:
        return self._telemetry.port

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> tuple[int, int | None]:
        """Start nodes (embedded), caches and both front ends; returns (grpc_port, rest_port)."""
        s = self.settings
        await self._telemetry.open_log()
        state_dir = self._state.claim()
        repository = await self._models.start(state_dir, self.metrics.registry, self.topology)
        await self._gpu.start()
        self._hops.start()
        try:
            await self._credentials.load()
            self._nodes = Nodes(s, self.kind, self.topology, repository, state_dir,
                                metrics=self.metrics, hops=self._hops, gpu=self._gpu,
                                revoking=self.workers or self.dataplane, fail=self.fail)
            await self._nodes.start()
            router = self._routing.start(repository)
            if s.sidecar:
                await self._membership.start()
            self.grpc_port, self.rest_port = await self._frontends.start(
                router, state_dir=state_dir, rescan_s=repository.rescan_s)
            if s.sidecar and self._nodes.across is not None:  # host-tier sidecars' hand-offs
                self._frontends.add_handlers([TakeHandler(self._nodes.across.taken)])
            operations = AdminOperations(self.topology, repository,
                                         default_timeout_s=s.cache.load_timeout_s, join=self.join)
            self.lifecycle = await Lifecycle.attach(
                self.topology, operations, add_grpc_handlers=self._frontends.add_handlers,
                stop=self.stop, grace_s=s.server.grace_s,
                health_services=self.protocol.health_services,
                leave_discovery=self._membership.leave, stop_frontends=self._frontends.stop,
                bind_address=s.server.admin_bind_address,
                port=s.server.admin_port if s.server.admin_port >= 0 else None,
                token=s.server.admin_token)
            self.admin_port = self.lifecycle.admin_port
            await self._telemetry.serve(tier=getattr(repository, "tier", None), spread=self.spread)
        except BaseException:
            await self.stop(grace=0)
            raise
        if self.discovery is not None and self.topology.in_ring:
            try:
                await self.join()
            except BaseException:
                await self.stop(grace=0)
                raise
        elif self.discovery is not None:
            log.info("discovery.join = false: following the %s membership but not registering; "
                     "`tfscache join` puts this sidecar on the ring", s.discovery.backend)
        if s.server.ports_file:
            _write_json_atomically(Path(s.server.ports_file),
                                   {"grpc": self.grpc_port, "rest": self.rest_port,
                                    "admin": self.admin_port, "pid": os.getpid(),
                                    "metrics": self.metrics_port})
        log.info("tfscache serve ready: gRPC port %s, REST port %s, %d backend(s)", self.grpc_port,
                 self.rest_port, len(self.topology.backends))
        return self.grpc_port, self.rest_port

    async def join(self) -> tuple[bool, str]:
        """Sidecar mode: register with discovery now and go on the own ring (idempotent).

        Returns (registered by this call, what happened). With static discovery there is
        nothing to register: membership is the peers files (add this sidecar to each, SIGHUP).
        FailedPrecondition when this is no sidecar or it is stopping.
        """
        return await self._membership.join(self.grpc_port, self.rest_port)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (``grace`` s), then stop caches and
        nodes."""
        grace = self.settings.server.grace_s if grace is None else grace
        if self._nodes is not None:
            self._nodes.stop_watching()
        self._routing.stop_sweeping()
        await self._membership.stop()  # leave the ring first, then drain
        await self._frontends.stop(grace)
        if self._nodes is not None:
            await self._nodes.stop_caches()
        await self._models.stop()
        await self._routing.close()  # before the nodes: see Routing.close
        await self.topology.close()
        await self._hops.close()
        if self._nodes is not None:
            await self._nodes.stop_children(grace)
        if self.lifecycle is not None:
            await self.lifecycle.close()
        await self._telemetry.stop()  # last: scrapes still answer while draining
        self._state.release()
        self._gpu.close()

    async def reload_tls(self) -> None:
        """SIGHUP: re-read the [tls] files; new connections get them, the listeners stay open."""
        await self._credentials.reload()
        if self.workers is not None:
            self.workers.reload_tls()
        if self.dataplane is not None:  # HAProxy writes its PEM again and reloads
            await self.dataplane.reload_tls()

    def fail(self, reason: str) -> None:
        """The process cannot serve: log why, and let ``tfscache serve`` exit 1."""
        log.error("tfscache serve cannot go on: %s", reason)
        self.failure = reason
        self.failed.set()

    async def set_peers(self, peers: list[Peer]) -> None:
        """Sidecar mode: the sidecars on the ring (this one included), replacing the previous list
        (``Topology.set_peers``: discovery and SIGHUP call that directly; tests call this)."""
        self.topology.set_peers(peers)


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
