"""Draining: one local node, or the whole ``tfscache serve`` process.

A node drain (embedded mode, ``tfscache drain --node node1``):

1. the node leaves the ring: the router gets a ring without it, so no new request
   picks it (a request that picked it just before is refused UNAVAILABLE by its
   draining cache, and the router tries the model's next replica);
2. its cache drains: requests in flight finish, then every model is unloaded;
3. the node stays off the ring, its process running and empty.

A process drain (``tfscache drain``, or SIGTERM once serve.py calls ``drain_process``):

1. health turns NOT_SERVING, and ``leave_discovery`` deregisters from discovery
   (when ``app.discovery`` exists; the hook is a no-op otherwise);
2. sidecar mode: the ring drops this sidecar (again after every membership change
   discovery reports, since serve's ``set_peers`` always includes it), so requests it
   still receives for its own models are forwarded to their next replica; its cache
   drains as above while requests in flight finish; then the front ends stop (``grace_s``);
3. embedded mode: the front ends stop accepting and let requests in flight finish
   (``grace_s``), then every node's cache drains;
4. ``finished`` is set: serve.py then stops everything and exits 0.

Progress (models left to unload, leases) is read from the caches by ``progress()``;
the Drain RPC streams it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from tfscache import errors
from tfscache.admin.operations import Admin
from tfscache.ring import Ring

log = logging.getLogger("tfscache.admin.drain")

PROCESS = ""  # the drain target meaning "the whole process"


@dataclass(frozen=True)
class Progress:
    phase: str
    models_left: int
    models_total: int
    leases: int
    done: bool


class _Drain:
    def __init__(self, nodes: list[str], total: int) -> None:
        self.nodes = nodes
        self.total = total
        self.phase = "leaving"
        self.task: asyncio.Task | None = None
        self.error: errors.TfscacheError | None = None


class _Failed(Exception):
    """A drain stopped on an error, recorded in its ``_Drain.error``."""


class Drainer:
    """Runs drains of a ``ServeApp`` in background tasks (a client going away does not stop one)."""

    def __init__(self, app, admin: Admin, health=None) -> None:
        self.app = app
        self.admin = admin
        self.health = health
        self.finished = asyncio.Event()  # the process drain is complete: exit 0
        self._drains: dict[str, _Drain] = {}

    @property
    def draining(self) -> bool:
        return PROCESS in self._drains

    def start(self, node: str = PROCESS, grace_s: float | None = None) -> None:
        """Begin draining ``node`` (PROCESS: everything); a drain already running is left as it is."""
        if self.app.own_name is not None and node == self.app.own_name:
            node = PROCESS  # a sidecar's one node is the process
        running = self._drains.get(node)
        if running is not None and running.error is None:
            return
        # (a drain that failed, e.g. on an unhealthy node, starts again)
        if node != PROCESS:
            self.admin.cache(node)  # NOT_FOUND / UNAVAILABLE before anything changes
            others = [n for n in self.app.router.ring.nodes if n != node]
            if not others:
                raise errors.FailedPrecondition(f"node {node} is the last node on the ring; "
                                                "drain the whole process instead")
        nodes = self.admin.node_names() if node == PROCESS else [node]
        drain = self._drains[node] = _Drain(nodes, self._count(nodes)[0])
        grace = self.app.settings.server.grace_s if grace_s is None else grace_s
        coro = self._process(drain, grace) if node == PROCESS else self._node(drain, node)
        drain.task = asyncio.create_task(coro, name=f"tfscache-drain-{node or 'process'}")

    async def wait(self, node: str = PROCESS) -> None:
        drain = self._drains[self._target(node)]
        await asyncio.shield(drain.task)

    def progress(self, node: str = PROCESS) -> Progress:
        drain = self._drains.get(self._target(node))
        if drain is None:
            raise errors.NotFound(f"no drain of {node or 'this process'} is running")
        if drain.error is not None:
            raise drain.error
        left, leases = self._count(drain.nodes)
        done = drain.task is not None and drain.task.done()
        return Progress(drain.phase, left, max(drain.total, left), leases, done)

    def _target(self, node: str) -> str:
        return PROCESS if self.app.own_name is not None and node == self.app.own_name else node

    def _count(self, nodes: list[str]) -> tuple[int, int]:
        models = leases = 0
        for name in nodes:
            cache = getattr(self.app.backends.get(name), "cache", None)
            if cache is not None:
                snapshot = cache.snapshot()
                models += len(snapshot)
                leases += sum(m.leases for m in snapshot)
        return models, leases

    # -- the drains ------------------------------------------------------------------------

    async def _node(self, drain: _Drain, node: str) -> None:
        router = self.app.router
        ring = router.ring
        router.ring = Ring([n for n in ring.nodes if n != node], replicas=ring.replicas, vnodes=ring.vnodes)
        log.info("draining node %s: off the ring (%s)", node, ", ".join(router.ring.nodes))
        with contextlib.suppress(_Failed):
            await self._drain_caches(drain, [node])
            log.info("node %s drained", node)

    async def _process(self, drain: _Drain, grace: float) -> None:
        with contextlib.suppress(_Failed):
            await self._process_steps(drain, grace)

    async def _process_steps(self, drain: _Drain, grace: float) -> None:
        log.info("draining this tfscache: health NOT_SERVING, leaving the ring")
        if self.health is not None:
            self.health.set_draining()
        await self.leave_discovery()
        app = self.app
        if app.own_name is not None:  # sidecar: peers take our models while ours finish
            self._leave_ring()
            discovery = getattr(app, "discovery", None)
            if discovery is not None:  # serve's set_peers puts us back on each change: leave again after it
                discovery.subscribe(lambda peers: self._leave_ring())
            await self._drain_caches(drain, drain.nodes)
        else:  # embedded: nowhere to send requests; finish those in flight, then unload
            drain.phase = "finishing requests"
            await self.stop_frontends(grace)
            with contextlib.suppress(_Failed):  # the front ends are gone: exit anyway; the nodes stop with us
                await self._drain_caches(drain, drain.nodes)
        drain.phase = "done"
        log.info("drained: %s; exiting", "every model unloaded" if drain.error is None else "unloading failed")
        self.finished.set()

    def _leave_ring(self) -> None:
        """Sidecar: a ring without this sidecar, unless it is the only one (then there is nowhere else)."""
        router, own = self.app.router, self.app.own_name
        others = [n for n in router.ring.nodes if n != own]
        if others and len(others) < len(router.ring.nodes):
            ring = router.ring
            router.ring = Ring(others, replicas=ring.replicas, vnodes=ring.vnodes)
            log.info("draining: off the ring (%s)", ", ".join(others))

    async def _drain_caches(self, drain: _Drain, nodes: list[str]) -> None:
        drain.phase = "unloading"
        caches = [self.admin.cache(n) for n in nodes if self.app.backends[n].cache is not None]
        try:
            await asyncio.gather(*(c.drain() for c in caches))
        except errors.TfscacheError as exc:
            drain.error = exc
        except Exception as exc:  # noqa: BLE001 - reported to whoever follows the drain
            log.exception("drain of %s failed", ", ".join(nodes))
            drain.error = errors.Internal(f"drain failed: {exc!r}")
        if drain.error is not None:
            log.error("drain of %s failed: %s; Drain again to retry", ", ".join(nodes), drain.error.message)
            raise _Failed()
        drain.phase = "done"

    # -- hooks -----------------------------------------------------------------------------

    async def leave_discovery(self) -> None:
        """Deregister from service discovery, if the app has one (``app.discovery``)."""
        discovery = getattr(self.app, "discovery", None)
        if discovery is None:
            return
        try:
            await discovery.deregister()
        except Exception as exc:  # noqa: BLE001 - health is NOT_SERVING already; keep draining
            log.warning("drain: deregistering from discovery failed: %s", exc)

    async def stop_frontends(self, grace: float) -> None:
        """Stop accepting requests and wait up to ``grace`` s for those in flight (embedded drain)."""
        grpc_frontend = getattr(self.app, "_grpc", None)
        rest_frontend = getattr(self.app, "_rest", None)
        if grpc_frontend is not None:
            await grpc_frontend.stop(grace)
        if rest_frontend is not None:
            await rest_frontend.stop()
