"""Draining: one local node, or the whole ``tfscache serve`` process.

A node drain (embedded mode, ``tfscache drain --node node1``):

1. the node leaves the ring (``Topology.drain``): the router gets a ring without it,
   and it stays off whatever membership changes follow, so no new request picks it
   (a request that picked it just before is refused UNAVAILABLE by its
   draining cache, and the router tries the model's next replica);
2. its cache drains: requests in flight finish, then every model is unloaded;
3. the node stays off the ring, its process running and empty.

A process drain (``tfscache drain`` with no ``--node``; SIGTERM is the shorter shutdown of ``Lifecycle``):

1. health turns NOT_SERVING, and ``leave_discovery`` deregisters from discovery
   (the hook serve.py passes; none: nothing to leave);
2. sidecar mode: the ring drops this sidecar (``Topology.drain`` of its own node: it stays
   off after every membership change discovery reports, unless no other sidecar is left),
   so requests it still receives for its own models are forwarded to their next replica; its cache
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tfscache import errors
from tfscache.admin.operations import AdminOperations
from tfscache.cluster.topology import Topology

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
    """Runs drains in background tasks (a client going away does not stop one).

    ``grace_s``: how long a process drain lets requests in flight finish by default;
    ``leave_discovery()`` deregisters (sidecar); ``stop_frontends(grace)`` stops accepting
    and waits for requests in flight (an embedded process drain).
    """

    def __init__(self, topology: Topology, admin: AdminOperations, *, grace_s: float, health=None,
                 leave_discovery: Callable[[], Awaitable[None]] | None = None,
                 stop_frontends: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.topology = topology
        self.admin = admin
        self.grace_s = grace_s
        self.health = health
        self._leave_discovery = leave_discovery
        self._stop_frontends = stop_frontends
        self.finished = asyncio.Event()  # the process drain is complete: exit 0
        self._drains: dict[str, _Drain] = {}

    @property
    def draining(self) -> bool:
        return PROCESS in self._drains

    def start(self, node: str = PROCESS, grace_s: float | None = None) -> None:
        """Begin draining ``node`` (PROCESS: everything); a drain already running is left as it is."""
        node = self._target(node)  # a sidecar's one node is the process
        running = self._drains.get(node)
        if running is not None and running.error is None:
            return
        # (a drain that failed, e.g. on an unhealthy node, starts again)
        if node != PROCESS:
            self.admin.cache(node)  # NOT_FOUND / UNAVAILABLE before anything changes
            self.topology.drain(node)  # off the ring now; FAILED_PRECONDITION if it is the last
            log.info(
                "draining node %s: off the ring (%s)", node, ", ".join(self.topology.ring.nodes)
            )
        nodes = self.admin.node_names() if node == PROCESS else [node]
        drain = self._drains[node] = _Drain(nodes, self._count(nodes)[0])
        grace = self.grace_s if grace_s is None else grace_s
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
        own = self.topology.own
        return PROCESS if own is not None and node == own else node

    def _count(self, nodes: list[str]) -> tuple[int, int]:
        models = leases = 0
        for name in nodes:
            backend = self.topology.node(name)
            cache = backend.cache if backend is not None else None
            if cache is not None:
                snapshot = cache.snapshot()
                models += len(snapshot)
                leases += sum(m.leases for m in snapshot)
        return models, leases

    # -- the drains ------------------------------------------------------------------------

    async def _node(self, drain: _Drain, node: str) -> None:
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
        own = self.topology.own
        if own is not None:  # sidecar: peers take our models while ours finish
            self.topology.drain(own)  # stays off across membership changes; on while it is alone
            log.info("draining: off the ring (%s)", ", ".join(self.topology.ring.nodes))
            await self._drain_caches(drain, drain.nodes)
        else:  # embedded: nowhere to send requests; finish those in flight, then unload
            drain.phase = "finishing requests"
            await self.stop_frontends(grace)
            # the front ends are gone: exit anyway; the nodes stop with us
            with contextlib.suppress(_Failed):
                await self._drain_caches(drain, drain.nodes)
        drain.phase = "done"
        log.info(
            "drained: %s; exiting",
            "every model unloaded" if drain.error is None else "unloading failed",
        )
        self.finished.set()

    async def _drain_caches(self, drain: _Drain, nodes: list[str]) -> None:
        drain.phase = "unloading"
        caches = [self.admin.cache(n) for n in nodes if self.topology.node(n).cache is not None]
        try:
            await asyncio.gather(*(c.drain() for c in caches))
        except errors.TfscacheError as exc:
            drain.error = exc
        except Exception as exc:  # noqa: BLE001 - reported to whoever follows the drain
            log.exception("drain of %s failed", ", ".join(nodes))
            drain.error = errors.Internal(f"drain failed: {exc!r}")
        if drain.error is not None:
            log.error(
                "drain of %s failed: %s; Drain again to retry",
                ", ".join(nodes),
                drain.error.message,
            )
            raise _Failed()
        drain.phase = "done"

    # -- hooks -----------------------------------------------------------------------------

    async def leave_discovery(self) -> None:
        """Deregister from service discovery, if there is one (the ``leave_discovery`` hook)."""
        if self._leave_discovery is None:
            return
        try:
            await self._leave_discovery()
        except Exception as exc:  # noqa: BLE001 - health is NOT_SERVING already; keep draining
            log.warning("drain: deregistering from discovery failed: %s", exc)

    async def stop_frontends(self, grace: float) -> None:
        """Stop accepting requests and wait up to ``grace`` s for those in flight (embedded drain)."""
        if self._stop_frontends is not None:
            await self._stop_frontends(grace)
