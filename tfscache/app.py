"""`tfscache serve`: front ends speaking a model server's own API (TF Serving's, or Triton's
Open Inference Protocol: ``node.backend``, tfscache.kinds.table) over a ring of nodes, embedded
(``--local-nodes K`` children, one CacheManager each) or sidecar (``--node-address``: one node;
a request for a model another sidecar owns is forwarded to it, one hop, marked).

``ServeApp`` is the whole process minus argument parsing and signals, so tests can run it
in-process. Nothing here imports tensorflow or tritonclient.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from pathlib import Path

import aiohttp

from tfscache import errors
from tfscache.admin.lifecycle import Lifecycle
from tfscache.admin.operations import AdminOperations
from tfscache.cache.manager import CacheManager
from tfscache.cluster.copymetrics import CopiesCollector
from tfscache.cluster.spread import Spread, rule_from
from tfscache.discovery import Discovery, Peer, advertise_peer, from_settings
from tfscache.frontend.backends import NodeBackend, PeerBackend
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.rest import RestFrontend
from tfscache.frontend.router import Router
from tfscache.frontend.upstream import Upstream, http_session
from tfscache.kinds.gpumem import NodeGpuMemory, NvmlReader, gpu_cap
from tfscache.observe.metrics import Metrics
from tfscache.kinds.table import KINDS
from tfscache.kinds.nodepid import NodeMemory, find_node_pid, is_local_host
from tfscache.observe.server import ObserveServer, watch
from tfscache.repository.opener import open_repository
from tfscache.repository.local import ModelRepository
from tfscache.observe.requestlog import RequestLog
from tfscache.settings import Settings, remote_url
from tfscache.settings.statedir import StateDirLock, choose, instance_name
from tfscache.kinds.supervisor import NodeProcess, Supervisor
from tfscache.observe.tiermetrics import TierMetrics
from tfscache.tls import PeerTls, ServerTls
from tfscache.cluster.topology import Topology
from tfscache.workers.control import WorkerPool, internal

log = logging.getLogger("tfscache.app")


class ServeApp:
    """Front ends, router, caches and (embedded) node children of one `tfscache serve`."""

    def __init__(self, settings: Settings, config_file: str | None = None) -> None:
        self.settings = settings
        self.config_file = config_file  # the static discovery backend re-reads it on SIGHUP
        self.discovery: Discovery | None = None
        # A bucket's repository is opened in start(), once the state directory (its tier's default) is known.
        self.repository = ModelRepository("." if remote_url(settings.model_repository) else settings.model_repository)
        self.kind = KINDS[settings.node.backend]  # the node kind: children, client, adapter, protocol
        self.protocol = self.kind.part("protocol")  # the API the front ends speak
        self.grpc_port: int | None = None
        self.rest_port: int | None = None
        self.supervisor: Supervisor | None = None
        self._own_state_dir = False  # a temporary one, removed at stop (the default was taken)
        self._state_lock: StateDirLock | None = None
        self.state_dir = Path(settings.node.state_dir) if settings.node.state_dir else None
        self._http: aiohttp.ClientSession | None = None
        self._grpc: GrpcFrontend | None = None
        self._rest: RestFrontend | None = None
        self.router: Router | None = None
        # Backends, ring, joined and drained nodes; every change goes through it. Sidecar mode: its
        # own node is on its ring once joined (or joining at start-up); discovery.join = false keeps
        # it out until join(); static and dns discovery ignore that setting.
        self.topology = Topology(replicas=settings.ring.replicas_per_model, vnodes=settings.ring.vnodes,
                                 own=(settings.ring.self_name or "local") if settings.sidecar else None,
                                 in_ring=settings.discovery.join or settings.discovery.backend in ("static", "dns"),
                                 make_peer=self._peer_backend, retire_grace_s=settings.cache.load_timeout_s)
        self.joined = False  # registered with discovery
        self._join_lock = asyncio.Lock()
        self.lifecycle: Lifecycle | None = None  # health on the gRPC port, admin server, drains
        self.admin_port: int | None = None
        self.metrics = Metrics(per_model=settings.server.metrics_per_model, scale=settings.scale,
                               request_log=RequestLog(settings.server.request_log) if settings.server.request_log
                               else None)
        watch(self.metrics, self.topology)
        # Copies that follow load (docs/copies.md): None keeps fixed replicas.
        self.spread = Spread(rule_from(settings.copies, settings.ring), sweep_s=settings.copies.sweep_s) \
            if settings.copies.enabled else None
        self._sweeper: asyncio.Task | None = None
        if self.spread is not None:
            self.spread.watch(lambda: {node.name: node for node in self.topology.nodes()})
            self.metrics.registry.register(CopiesCollector(self.spread, settings.server.metrics_per_model))
        self.metrics_port: int | None = None
        self._observe: ObserveServer | None = None
        self._gpu_reader: NvmlReader | None = None
        self.gpu_cap = 0  # the GPU memory cap in force (0: none, or no GPU to measure it)
        self.failed = asyncio.Event()  # set when the process cannot go on (its node never came up)
        self.failure = ""
        self._watchdog: asyncio.Task | None = None
        self.tls: ServerTls | None = None  # [tls]: the front ends' certificate (reload_tls re-reads it)
        self._peer_tls: PeerTls | None = None  # sidecar mode with [tls]: the hop to peers
        # server.workers > 1: worker processes serve the public ports; the front ends here are internal.
        self.workers = WorkerPool(settings, nodes=lambda: {n.name: n for n in self.topology.nodes()},
                                  router=lambda: self.router, health=lambda: self.lifecycle and self.lifecycle.health,
                                  spread=self.spread, metrics=self.metrics) if settings.server.workers > 1 else None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> tuple[int, int | None]:
        """Start nodes (embedded), caches and both front ends; returns (grpc_port, rest_port)."""
        s = self.settings
        if self.metrics.request_log is not None:  # --request-log: opened (or refused) before anything starts
            await self.metrics.request_log.start()
        self._claim_state_dir()
        if remote_url(s.model_repository):  # a bucket: a disk tier nodes load from (tfscache.storage)
            tier_metrics = TierMetrics(self.metrics.registry)
            self.repository = open_repository(s, self.state_dir, events=tier_metrics)
            self.repository.set_in_use(lambda key: {b.cache.state_of(*key) for b in self.topology.nodes()
                                                    if b.cache is not None} - {None})
            tier_metrics.watch(self.repository.tier)
        await self.repository.start()
        if s.cache.gpu_memory_per_node:  # NVML only when a GPU cap is asked for
            self._gpu_reader = NvmlReader()
            self.gpu_cap, line = await asyncio.to_thread(gpu_cap, s.cache.gpu_memory_per_node, self._gpu_reader)
            log.log(logging.INFO if self.gpu_cap else logging.WARNING, "%s", line)
        self._http = http_session()
        try:
            if s.tls.cert_file:
                self.tls = await asyncio.to_thread(ServerTls, s.tls)
                self._peer_tls = await asyncio.to_thread(PeerTls, s.tls) if s.sidecar else None
            self.router = await (self._start_sidecar() if s.sidecar else self._start_embedded())
            # Worker mode: these are the control process's internal listeners (127.0.0.1, plain, uncounted).
            fe, tls, metrics = internal(s.server, self.metrics) if self.workers else (s.server, self.tls, self.metrics)
            self._grpc = GrpcFrontend(self.router, bind_address=fe.bind_address, port=fe.grpc_port,
                                      max_send_bytes=s.server.max_send_message_bytes,
                                      max_receive_bytes=s.server.max_receive_message_bytes,
                                      protocol=self.protocol, metrics=metrics,
                                      credentials=tls.grpc_credentials() if tls else None)
            self.grpc_port = await self._grpc.start()
            if s.server.rest_port >= 0:
                self._rest = RestFrontend(self.router, bind_address=fe.bind_address, port=fe.rest_port,
                                          max_receive_bytes=s.server.max_receive_message_bytes,
                                          timeout_s=s.server.rest_timeout_s, metrics=metrics,
                                          protocol=self.protocol, ssl_context=tls.ssl_context if tls else None,
                                          refusal_log_period_s=s.server.refusal_log_period_s)
                self.rest_port = await self._rest.start()
            if self.workers is not None:  # the public ports, served by the workers from now on
                self.grpc_port, self.rest_port = await self.workers.start(
                    self.grpc_port, self.rest_port, state_dir=self.state_dir, rescan_s=self.repository.rescan_s)
            operations = AdminOperations(self.topology, self.repository,
                                         default_timeout_s=s.cache.load_timeout_s, join=self.join)
            self.lifecycle = await Lifecycle.attach(
                self.topology, operations, add_grpc_handlers=self._grpc.add_handlers, stop=self.stop,
                grace_s=s.server.grace_s, health_services=self.protocol.health_services,
                leave_discovery=self._leave_discovery,
                stop_frontends=self._stop_frontends, bind_address=s.server.admin_bind_address,
                port=s.server.admin_port if s.server.admin_port >= 0 else None, token=s.server.admin_token)
            self.admin_port = self.lifecycle.admin_port
            if s.server.metrics_port >= 0:
                self._observe = ObserveServer(self.metrics, self.topology, bind_address=s.server.bind_address,
                                              port=s.server.metrics_port, tier=getattr(self.repository, "tier", None),
                                              spread=self.spread)
                self.metrics_port = await self._observe.start()
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

    @property
    def backends(self):
        """Every backend by ring name (``Topology.backends``; read-only)."""
        return self.topology.backends

    def _claim_state_dir(self) -> None:
        """``node.state_dir``, else the instance's persistent default, locked (tfscache.settings.statedir)."""
        s = self.settings
        instance = (instance_name(node_address=s.node.node_address) if s.sidecar
                    else instance_name(model_repository=s.model_repository))
        self.state_dir, self._state_lock, self._own_state_dir = choose(self.state_dir, instance)

    async def join(self) -> tuple[bool, str]:
        """Sidecar mode: register with discovery now and go on the own ring (idempotent).

        Returns (registered by this call, what happened). With static discovery there is
        nothing to register: membership is the peers files (add this sidecar to each, SIGHUP).
        FailedPrecondition when this is no sidecar or it is stopping.
        """
        own = self.topology.own
        if own is None:
            raise errors.FailedPrecondition("join: this tfscache is not in sidecar mode (no node.node_address); "
                                            "it has no discovery to join")
        async with self._join_lock:
            if self.discovery is None:
                raise errors.FailedPrecondition("join: this sidecar is stopping; it has left discovery")
            static = bool(self.discovery.registration_note)  # static, dns: nothing to register
            if not self.joined:
                await self.discovery.register(advertise_peer(self.settings, self.grpc_port, self.rest_port))
                self.joined = True
            elif not static:
                return False, f"{own} is already registered with {self.discovery.name} discovery"
            if static:
                return False, self.discovery.registration_note
            self.topology.join()
            log.info("joined: registered %s with %s discovery", own, self.discovery.name)
            return True, f"{own} registered with {self.discovery.name} discovery"

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (``grace`` s), then stop caches and nodes."""
        grace = self.settings.server.grace_s if grace is None else grace
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.discovery is not None:  # leave the ring first, then drain
            await self.discovery.deregister()
            await self.discovery.stop()
            self.discovery = None
        await self._stop_frontends(grace)
        for node in self.topology.nodes():
            if node.cache is not None:
                await node.cache.stop()
        if self.repository is not None:
            await self.repository.stop()
        if self.router is not None:  # our connections to the nodes go first: a node (tritonserver)
            await self.router.close()  # waits for open HTTP connections before it exits
        await self.topology.close()
        if self._http is not None:
            await self._http.close()
        if self.supervisor is not None:
            await self.supervisor.stop(grace=max(grace, 1.0))
        if self.lifecycle is not None:
            await self.lifecycle.close()
        if self._observe is not None:  # last: scrapes still answer while draining
            await self._observe.stop()
        if self.metrics.request_log is not None:
            await self.metrics.request_log.close()
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._state_lock is not None:
            self._state_lock.release()
        if self._gpu_reader is not None:
            self._gpu_reader.close()

    async def reload_tls(self) -> None:
        """SIGHUP: re-read the [tls] files; new connections get them, the listeners stay open."""
        for credentials in (self.tls, self._peer_tls):
            if credentials is not None:
                await credentials.reload()
        if self.workers is not None:
            self.workers.reload_tls()

    async def _leave_discovery(self) -> None:
        """Deregister (the drain's first step, and SIGTERM's); stop() then stops discovery."""
        if self.discovery is not None:
            await self.discovery.deregister()

    async def _stop_frontends(self, grace: float) -> None:
        """Stop accepting requests and let those in flight finish (an embedded process drain); workers first."""
        if self.workers is not None:
            await self.workers.stop(grace)
        if self._grpc is not None:
            await self._grpc.stop(grace)
        if self._rest is not None:
            await self._rest.stop()

    # -- topologies --------------------------------------------------------------------

    def _router(self) -> Router:
        """The router, following every change of the topology from now on."""
        router = Router(self.topology.ring, self.topology.backends, local=self.topology.own,
                        repository=self.repository, wait_s=self.settings.cache.load_timeout_s, metrics=self.metrics,
                        spread=self.spread)
        self.topology.bind(router)
        if self.spread is not None:
            self._sweeper = asyncio.create_task(self.spread.run(), name="tfscache-copies-sweep")
        return router

    async def _start_embedded(self) -> Router:
        s = self.settings
        self.supervisor = Supervisor(s.node, self.state_dir, on_start=self._node_started, on_exit=self._node_exited,
                                     launcher=self.kind.part("launcher")(s.node, self.repository.root, self.state_dir))
        self.topology.set_nodes(NodeBackend(node.name) for node in self.supervisor.nodes)
        await self.supervisor.start()
        return self._router()

    async def _start_sidecar(self) -> Router:
        s = self.settings
        host_port, _, rest_port = s.node.node_address.partition(",")
        host = host_port.rsplit(":", 1)[0]
        own = self.topology.own
        backend = NodeBackend(own)
        self.topology.set_nodes([backend])  # its own node, always: admin preloads and forwarded requests
        # The node is no child of ours: find its process (same host, PID namespace shared) so the
        # cache can measure its memory; None (sizes stay estimates) when it is not visible here.
        # Found again whenever that process is gone (TF Serving restarted in its container).
        port = int(host_port.rsplit(":", 1)[1])
        node_pid = await asyncio.to_thread(find_node_pid, host, port)  # a host-wide socket scan
        local = await asyncio.to_thread(is_local_host, host)
        find = (lambda: find_node_pid(host, port)) if local else None  # the reloader calls it in a thread
        await self._attach(backend, host_port, f"{host}:{rest_port}" if rest_port else None, node_pid=node_pid,
                           find_node_pid=find)
        # The front end serves at once; health stays NOT_SERVING until the node answers (in a pod,
        # both containers start together) and the cache re-adopted what it serves.
        self._watchdog = asyncio.create_task(self._await_node(backend, host_port), name="tfscache-await-node")
        self.router = self._router()
        self.discovery = from_settings(s, self.config_file)
        await self.discovery.start()
        # Membership changes (and SIGHUP's re-read peers file) go to the topology.
        self.topology.set_peers(self.discovery.members())
        self.discovery.subscribe(self.topology.set_peers)
        return self.router

    async def _await_node(self, backend: NodeBackend, address: str) -> None:
        """Sidecar mode: fail the process if its node does not answer within ``node.start_timeout_s``."""
        timeout = self.settings.node.start_timeout_s
        cache = backend.cache
        if cache is not None and not await cache.wait_ready(timeout) and not cache.draining:
            self.fail(f"node {address} did not answer within node.start_timeout_s = {timeout} s")

    def fail(self, reason: str) -> None:
        """The process cannot serve: log why, and let ``tfscache serve`` exit 1."""
        log.error("tfscache serve cannot go on: %s", reason)
        self.failure = reason
        self.failed.set()

    async def set_peers(self, peers: list[Peer]) -> None:
        """Sidecar mode: the sidecars on the ring (this one included), replacing the previous list
        (``Topology.set_peers``: discovery and SIGHUP call that directly; tests call this)."""
        self.topology.set_peers(peers)

    def _peer_backend(self, peer: Peer) -> PeerBackend:
        """A backend for another sidecar's front end (Topology.set_peers makes one per new peer)."""
        return PeerBackend(peer.name, self._upstream(peer.grpc, peer.rest or None, self._peer_tls, keepalive=True),
                           self.topology.own, on_load=self.spread.copies.report
                           if self.spread is not None and self.settings.copies.peer_reports else None)

    def _upstream(self, grpc_address: str, rest_address: str | None, tls: PeerTls | None = None,
                  keepalive: bool = False) -> Upstream:
        server = self.settings.server
        # The hop to a node carries what the client may send and what the node may answer.
        return Upstream(grpc_address, rest_address, self._http,
                        max_send_bytes=server.max_receive_message_bytes,
                        max_receive_bytes=server.max_send_message_bytes, tls=tls, keepalive=keepalive)

    async def _attach(self, backend: NodeBackend, grpc_address: str, rest_address: str | None,
                      node_pid: int | None, find_node_pid=None) -> None:
        upstream = self._upstream(grpc_address, rest_address)
        # The cache names its node as metrics and status do (node0), not by address.
        client = self.kind.part("client")(backend.name, rpc_deadline_s=self.settings.cache.rpc_deadline_s,
                                  channel=upstream.channel)
        state_file = self.state_dir / f"{backend.name}.cache.json"
        adapter = self.kind.part("adapter")(client, self.repository, rpc_deadline_s=client.rpc_deadline_s,
                                             memory=NodeMemory(node_pid, find_node_pid))
        gpu = NodeGpuMemory(self._gpu_reader, lambda: adapter.node_pid) if self.gpu_cap else None
        cache = CacheManager(adapter, self.repository, self.settings.cache, state_file=state_file,
                             events=self.metrics.cache_events(backend.name), gpu=gpu, gpu_cap=self.gpu_cap,
                             before_unload=self.workers.revoker(backend.name) if self.workers else None)
        try:
            await cache.start()
        except BaseException:
            await upstream.close()
            raise
        backend.attach(upstream, cache, load_timeout_s=self.settings.cache.load_timeout_s)

    async def _node_started(self, node: NodeProcess) -> None:
        await self._attach(self.topology.node(node.name), node.grpc_address, node.rest_address, node.pid)

    async def _node_exited(self, node: NodeProcess) -> None:
        self.metrics.node_restarted(node.name)  # the supervisor restarts it next
        backend = self.topology.node(node.name)
        cache, upstream = backend.cache, backend.upstream
        backend.detach()
        if cache is not None:
            await cache.stop()
        if upstream is not None:
            await upstream.close()


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
