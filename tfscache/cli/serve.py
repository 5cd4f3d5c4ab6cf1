"""`tfscache serve` on the command line: flags and settings, logging, signals, exit status.

The process itself is ``tfscache.app.ServeApp``. SIGTERM/SIGINT: health NOT_SERVING, out of
discovery, then requests in flight finish; SIGHUP: static discovery re-reads its peers, and
the [tls] files are read again.
Exit status: 0 after a clean stop, 1 when start-up failed or a sidecar's node never came up,
2 for a bad flag or setting, a missing or too old haproxy (--data-plane haproxy), or an extra
the settings need that is not installed (before anything starts: tfscache.kinds.preflight).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from tfscache import logs
from tfscache.kinds import preflight
from tfscache import settings as settings_mod
from tfscache.cli.options import Parser, log_level
from tfscache.extras import MissingExtra
from tfscache.dataplane import binary as haproxy
from tfscache.dataplane.binary import HaproxyUnavailable
from tfscache.app import ServeApp
from tfscache.settings import Settings

log = logging.getLogger("tfscache.app")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tfscache serve",
        description="gRPC and REST front ends speaking the nodes' own API (--backend: the kind of node) "
        "that load models on demand onto a ring of nodes.",
        epilog="Every setting (see --help-settings) can also come from the --config TOML file or a "
        "TFSCACHE_<SECTION>_<FIELD> environment variable; flags win.",
    )
    settings_mod.add_arguments(parser)
    parser.add_argument("--help-settings", action="store_true", help="list every setting and exit")
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=os.environ.get("TFSCACHE_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default $TFSCACHE_LOG_LEVEL or INFO)",
    )
    parser.add_argument("--log-json", dest="log_json", action="store_true", default=None,
                        help="log JSON objects, one per line (setting log_json)")
    return parser


async def _run(settings: Settings, config_file: str | None = None) -> int:
    app = ServeApp(settings, config_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task] = set()

    def reload_peers() -> None:  # SIGHUP: the static backend re-reads the config file's peers
        for coroutine in (
            app.discovery.reload() if app.discovery is not None else None,
            app.reload_tls(),
        ):
            if coroutine is not None:  # ... and the TLS files are read again (tfscache.tls)
                task = loop.create_task(coroutine)
                reloads.add(task)
                task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_peers)
    try:
        await app.start()
    except Exception as exc:  # noqa: BLE001 - start-up failure: say why and exit non-zero
        log.error("tfscache serve failed to start: %s", exc)
        return 1
    # SIGTERM: health NOT_SERVING, out of discovery, then requests in flight finish;
    # an admin Drain of the whole process ends here too, once every model is unloaded.
    # A node that never came up (app.fail) stops it the same way, with exit status 1.
    failed = loop.create_task(app.failed.wait())
    failed.add_done_callback(lambda _: stop.set())
    rc = await app.lifecycle.run_until(stop)
    failed.cancel()
    return 1 if app.failed.is_set() else rc


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.help_settings:
        print(settings_mod.describe())
        return 0
    try:
        settings = settings_mod.from_args(args)
        preflight.check(settings)
        if settings.server.data_plane == "haproxy":
            haproxy.check(settings.server.haproxy_binary)
    except (settings_mod.SettingsError, MissingExtra, HaproxyUnavailable) as exc:
        print(f"tfscache serve: {exc}", file=sys.stderr)
        return 2
    logs.setup(args.log_level, json_lines=settings.log_json)
    if settings.log_json:  # embedded `tfscache node` children inherit it
        os.environ["TFSCACHE_LOG_JSON"] = "1"
    return asyncio.run(_run(settings, args.config))
