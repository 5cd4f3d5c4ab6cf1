"""Wiring health, the admin server and drains into a running ``ServeApp`` (serve.py calls this).

    ops = await Operations.attach(app, bind_address="127.0.0.1", port=8502, token="")
    # ops.health is registered on the front end's gRPC server; ops.admin_port is bound
    code = await ops.run_until(stop)    # stop: an asyncio.Event set by SIGTERM/SIGINT
    # SIGTERM: health NOT_SERVING, leave discovery, then app.stop(grace) lets requests finish.
    # An admin Drain of the process: the same, plus every model unloaded first; then 0.
"""

from __future__ import annotations

import asyncio
import logging

from tfscache.admin.server import AdminServer
from tfscache.health import Health, app_serving

log = logging.getLogger("tfscache.admin")


class Operations:
    """Health, admin server and drainer of one ServeApp."""

    def __init__(self, app, health: Health, admin: AdminServer | None) -> None:
        self.app, self.health, self.admin = app, health, admin
        self.admin_port = admin.port if admin is not None else None

    @classmethod
    async def attach(cls, app, *, bind_address: str = "127.0.0.1", port: int | None = 8502, token: str = "",
                     health_poll_s: float = 1.0) -> Operations:
        """Register health on ``app``'s gRPC front end and start the admin server (``port`` None: no admin)."""
        health = Health(lambda: app_serving(app), poll_s=health_poll_s)
        app._grpc._server.add_generic_rpc_handlers([health.handler()])  # grpc.aio accepts these after start
        admin = None
        if port is not None:
            admin = AdminServer(app, bind_address=bind_address, port=port, token=token, health=health)
            await admin.start()
        return cls(app, health, admin)

    @property
    def drained(self) -> asyncio.Event | None:
        return self.admin.drainer.finished if self.admin is not None else None

    async def run_until(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` (SIGTERM) or a finished process drain; then shut down in order; 0."""
        waits = [asyncio.ensure_future(stop.wait())]
        if self.drained is not None:
            waits.append(asyncio.ensure_future(self.drained.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        await self.shutdown()
        return 0

    async def shutdown(self, grace: float | None = None) -> None:
        """NOT_SERVING first, out of discovery, then the app stops (requests in flight finish)."""
        self.health.set_draining()
        if self.admin is not None:
            await self.admin.drainer.leave_discovery()
        log.info("stopping: letting requests in flight finish for up to %s s",
                 self.app.settings.server.grace_s if grace is None else grace)
        await self.app.stop(grace)
        if self.admin is not None:
            await self.admin.stop()
