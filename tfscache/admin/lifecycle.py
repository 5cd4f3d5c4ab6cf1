"""Health, the admin server and drains of one ``tfscache serve`` (serve.py's ``ServeApp`` builds this).

    lifecycle = await Lifecycle.attach(topology, operations, add_grpc_handlers=grpc_frontend.add_handlers,
                                       stop=app.stop, grace_s=5, leave_discovery=..., stop_frontends=...,
                                       bind_address="127.0.0.1", port=8502, token="")
    # health is served on the front end's gRPC port; lifecycle.admin_port is bound (port None: no admin)
    code = await lifecycle.run_until(stop)    # stop: an asyncio.Event set by SIGTERM/SIGINT
    # SIGTERM: health NOT_SERVING, leave discovery, then stop(grace) lets requests finish.
    # An admin Drain of the process: the same, plus every model unloaded first; then 0.

It gets the typed pieces it needs (the topology, the admin operations, callables for what
only the app can do), never the app: ``ServeApp`` stays the one owner of start-up and
shutdown order, and ``stop`` is its ``ServeApp.stop``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from tfscache.admin.drain import Drainer
from tfscache.admin.operations import AdminOperations
from tfscache.admin.server import AdminServer
from tfscache.frontend.health import Health
from tfscache.cluster.topology import Topology

log = logging.getLogger("tfscache.admin")


class Lifecycle:
    """Health, drainer and (optional) admin server of one process, and its shutdown sequence."""

    def __init__(self, health: Health, drainer: Drainer, admin: AdminServer | None, *,
                 stop: Callable[[float | None], Awaitable[None]], grace_s: float) -> None:
        self.health, self.drainer, self.admin = health, drainer, admin
        self.admin_port = admin.port if admin is not None else None
        self._stop = stop
        self._grace_s = grace_s

    @classmethod
    async def attach(cls, topology: Topology, operations: AdminOperations, *,
                     add_grpc_handlers: Callable[[list[grpc.GenericRpcHandler]], None],
                     stop: Callable[[float | None], Awaitable[None]], grace_s: float,
                     leave_discovery: Callable[[], Awaitable[None]] | None = None,
                     stop_frontends: Callable[[float], Awaitable[None]] | None = None,
                     bind_address: str = "127.0.0.1", port: int | None = 8502, token: str = "",
                     health_services: tuple[str, ...], health_poll_s: float = 1.0) -> Lifecycle:
        """Serve health through ``add_grpc_handlers`` and start the admin server (``port`` None: none)."""
        health = Health(topology.serving, services=health_services, poll_s=health_poll_s)
        add_grpc_handlers([health.handler()])
        await health.start()
        drainer = Drainer(
            topology,
            operations,
            grace_s=grace_s,
            health=health,
            leave_discovery=leave_discovery,
            stop_frontends=stop_frontends,
        )
        admin = None
        if port is not None:
            admin = AdminServer(
                operations, drainer, bind_address=bind_address, port=port, token=token
            )
            try:
                await admin.start()
            except BaseException:
                await health.stop()
                raise
        return cls(health, drainer, admin, stop=stop, grace_s=grace_s)

    @property
    def drained(self) -> asyncio.Event:
        """Set when a drain of the whole process has finished (only the admin API starts one)."""
        return self.drainer.finished

    async def run_until(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` (SIGTERM) or a finished process drain; then shut down in order; 0."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.drained.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        await self.shutdown()
        return 0

    async def shutdown(self, grace: float | None = None) -> None:
        """NOT_SERVING first, out of discovery, then the app stops (requests in flight finish)."""
        self.health.set_draining()
        await self.drainer.leave_discovery()
        log.info("stopping: letting requests in flight finish for up to %s s",
                 self._grace_s if grace is None else grace)
        await self._stop(grace)
        await self.close()

    async def close(self) -> None:
        """Stop the admin server and health's polling (a second call does nothing)."""
        if self.admin is not None:
            await self.admin.stop()
        await self.health.stop()
