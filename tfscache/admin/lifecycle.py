"""Wiring health, the admin server and drains into a running ``ServeApp``.

``serve.py`` needs three calls (see the bottom of this docstring); tests and
``python -m tfscache.admin.lifecycle`` (serve's own flags plus the admin ones, for
running before serve.py has them) use the same code.

    ops = await Operations.attach(app, bind_address="127.0.0.1", port=8502, token="")
    # ops.health is registered on the front end's gRPC server; ops.admin_port is bound
    code = await ops.run_until(stop)    # stop: an asyncio.Event set by SIGTERM/SIGINT
    # SIGTERM: health NOT_SERVING, leave discovery, then app.stop(grace) lets requests finish.
    # An admin Drain of the process: the same, plus every model unloaded first; then 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from tfscache.admin.server import AdminServer, check_bind
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


# -- `python -m tfscache.admin.lifecycle`: tfscache serve with the admin server --------------


def _parser() -> argparse.ArgumentParser:
    from tfscache import serve

    parser = serve._parser()
    parser.prog = "python -m tfscache.admin.lifecycle"
    parser.add_argument("--admin-port", type=int, default=8502, help="admin API port (0: pick one; -1: off)")
    parser.add_argument("--admin-bind-address", default="127.0.0.1", help="admin API address")
    parser.add_argument("--admin-token", default=os.environ.get("TFSCACHE_ADMIN_TOKEN", ""),
                        help="required in 'authorization: Bearer TOKEN' metadata when set")
    parser.add_argument("--admin-ports-file", default="",
                        help="write {grpc, rest, admin, pid} here once everything serves")
    return parser


async def _run(settings, args) -> int:
    from tfscache.serve import ServeApp

    app = ServeApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
        ops = await Operations.attach(app, bind_address=args.admin_bind_address,
                                      port=None if args.admin_port < 0 else args.admin_port, token=args.admin_token)
    except Exception as exc:  # noqa: BLE001 - start-up failure: say why and exit non-zero
        log.error("tfscache serve failed to start: %s", exc)
        await app.stop(grace=0)
        return 1
    if args.admin_ports_file:
        path = Path(args.admin_ports_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"grpc": app.grpc_port, "rest": app.rest_port, "admin": ops.admin_port,
                                   "pid": os.getpid()}))
        os.replace(tmp, path)
    return await ops.run_until(stop)


def main(argv: list[str] | None = None) -> int:
    from tfscache import settings as settings_mod

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_mod.from_args(args)
        check_bind(args.admin_bind_address, args.admin_token)
    except ValueError as exc:  # SettingsError and AdminConfigError name the setting
        print(f"tfscache serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_run(settings, args))


if __name__ == "__main__":
    sys.exit(main())
