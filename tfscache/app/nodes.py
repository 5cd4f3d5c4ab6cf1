"""The nodes of one `tfscache serve` and their caches: embedded, the supervisor's children (each
attached as it starts, detached as it exits); sidecar, the one node at ``node.node_address``,
which is no child of ours. Each node gets one CacheManager over the kind's client and adapter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from tfscache.app.host import GpuCap
from tfscache.app.hops import Hops
from tfscache.cache.manager import CacheManager
from tfscache.app.tiers import HostTier
from tfscache.cache.tiers import GPU, HOST
from tfscache.cluster.topology import Topology
from tfscache.frontend.backends import NodeBackend
from tfscache.kinds.nodepid import NodeMemory, find_node_pid, is_local_host
from tfscache.kinds.supervisor import NodeProcess, Supervisor
from tfscache.observe.metrics import Metrics
from tfscache.repository.local import ModelRepository
from tfscache.settings import Settings

log = logging.getLogger("tfscache.cache")


class Revoking(Protocol):
    """What takes back the requests handed elsewhere before a node unloads (workers'
    delegations, the data plane's routes)."""

    def revoker(self, node: str) -> Callable[[list], Awaitable[None]]: ...


class Nodes:
    """``fail(reason)``: the process cannot go on (a sidecar's node never answered)."""

    def __init__(self, settings: Settings, kind, topology: Topology, repository: ModelRepository,
                 state_dir: Path, *, metrics: Metrics, hops: Hops, gpu: GpuCap,
                 revoking: Revoking | None, fail: Callable[[str], None]) -> None:
        self._settings = settings
        self._kind = kind  # the node kind: its launcher, client and adapter
        self._topology = topology
        self._repository = repository
        self._state_dir = state_dir
        self._metrics = metrics
        self._hops = hops
        self._gpu = gpu
        self._revoking = revoking
        self._fail = fail
        self.supervisor: Supervisor | None = None  # embedded mode
        # host-tier nodes with demotion on: what the caches hand their moves to (docs/tiers.md)
        self.across = (HostTier(topology, settings.cache.load_timeout_s)
                       if settings.moves_across else None)
        self._watchdog: asyncio.Task | None = None  # sidecar mode

    async def start(self) -> None:
        await (self._start_sidecar() if self._settings.sidecar else self._start_embedded())

    async def _start_embedded(self) -> None:
        s = self._settings
        launcher = self._kind.part("launcher")(s.node, self._repository.root, self._state_dir)
        self.supervisor = Supervisor(s.node, self._state_dir, on_start=self._node_started,
                                     on_exit=self._node_exited, launcher=launcher)
        nodes = self.supervisor.nodes
        self._topology.set_nodes((NodeBackend(node.name) for node in nodes),
                                 host_tier=[node.name for node in nodes if node.tier == HOST])
        await self.supervisor.start()

    async def _start_sidecar(self) -> None:
        host_port, _, rest_port = self._settings.node.node_address.partition(",")
        host = host_port.rsplit(":", 1)[0]
        backend = NodeBackend(self._topology.own)
        # Its own node, always: admin preloads and forwarded requests.
        self._topology.set_nodes([backend])
        # The node is no child of ours: find its process (same host, PID namespace shared) so the
        # cache can measure its memory; None (sizes stay estimates) when it is not visible here.
        # Found again whenever that process is gone (TF Serving restarted in its container).
        port = int(host_port.rsplit(":", 1)[1])
        node_pid = await asyncio.to_thread(find_node_pid, host, port)  # a host-wide socket scan
        local = await asyncio.to_thread(is_local_host, host)
        # The reloader calls it in a thread.
        find = (lambda: find_node_pid(host, port)) if local else None
        await self._attach(backend, host_port, f"{host}:{rest_port}" if rest_port else None,
                           node_pid=node_pid, find_node_pid=find, tier=self._settings.node.node_tier)
        # The front end serves at once; health stays NOT_SERVING until the node answers (in a pod,
        # both containers start together) and the cache re-adopted what it serves.
        self._watchdog = asyncio.create_task(self._await_node(backend, host_port),
                                             name="tfscache-await-node")

    async def _await_node(self, backend: NodeBackend, address: str) -> None:
        """Fail the process if its node does not answer within ``node.start_timeout_s``."""
        timeout = self._settings.node.start_timeout_s
        cache = backend.cache
        if cache is not None and not await cache.wait_ready(timeout) and not cache.draining:
            self._fail(f"node {address} did not answer within node.start_timeout_s = {timeout} s")

    async def _attach(self, backend: NodeBackend, grpc_address: str, rest_address: str | None,
                      node_pid: int | None, find_node_pid=None, tier: str = GPU) -> None:
        s = self._settings
        upstream = self._hops.upstream(grpc_address, rest_address)
        # The cache names its node as metrics and status do (node0), not by address.
        client = self._kind.part("client")(backend.name, rpc_deadline_s=s.cache.rpc_deadline_s,
                                           channel=upstream.channel)
        state_file = self._state_dir / f"{backend.name}.cache.json"
        adapter = self._kind.part("adapter")(client, self._repository,
                                             rpc_deadline_s=client.rpc_deadline_s,
                                             memory=NodeMemory(node_pid, find_node_pid))
        if s.cache.demote == HOST and self.across is not None:
            if rest_address is not None and self._kind.demotes_in_place:
                # Triton across nodes: its model configurations say which backends need a GPU
                # (never handed to the host tier)
                adapter.enable_demotion(rest_address, s.cache.demote_cpu_instances)
        elif s.cache.demote == HOST:
            # in place (Triton); settings refused it for other kinds without host-tier nodes
            if rest_address is None:
                log.warning("node %s: cache.demote = host needs the node's HTTP port "
                            "(--node-address HOST:GRPC,REST); its victims are unloaded",
                            backend.name)
            else:
                adapter.enable_demotion(rest_address, s.cache.demote_cpu_instances)
        revoker = self._revoking.revoker(backend.name) if self._revoking else None
        cache = CacheManager(adapter, self._repository, s.cache, state_file=state_file,
                             events=self._metrics.cache_events(backend.name),
                             # a host-tier node's GPU is hidden from it: no GPU cap there
                             gpu=self._gpu.for_node(lambda: adapter.node_pid) if tier == GPU
                             else None,
                             gpu_cap=self._gpu.cap,
                             before_unload=revoker, across=self.across, tier=tier)
        try:
            await cache.start()
        except BaseException:
            await upstream.close()
            raise
        backend.attach(upstream, cache, load_timeout_s=s.cache.load_timeout_s)

    async def _node_started(self, node: NodeProcess) -> None:
        await self._attach(self._topology.node(node.name), node.grpc_address, node.rest_address,
                           node.pid, tier=node.tier)

    async def _node_exited(self, node: NodeProcess) -> None:
        self._metrics.node_restarted(node.name)  # the supervisor restarts it next
        backend = self._topology.node(node.name)
        cache, upstream = backend.cache, backend.upstream
        backend.detach()
        if cache is not None:
            await cache.stop()
        if upstream is not None:
            await upstream.close()

    def stop_watching(self) -> None:
        """Sidecar mode: no longer fail the process if its node does not answer (stop's first
        step)."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def stop_caches(self) -> None:
        for node in self._topology.nodes():
            if node.cache is not None:
                await node.cache.stop()

    async def stop_children(self, grace: float) -> None:
        """Embedded mode: stop the node processes (after the router closed its connections)."""
        if self.supervisor is not None:
            await self.supervisor.stop(grace=max(grace, 1.0))
