"""``tfscache node``: a drop-in for tensorflow_model_server.

Flags are tensorflow_model_server's, with its defaults (docs/upstream/tfserving.md, "Flags"), plus
the tfscache extensions of docs/DESIGN.md (--bind_address, --ports_file,
--load_gate_dir, --max_request_tensor_bytes; --file_system_poll_wait_seconds takes a
float). Start-up follows
``ms/server.cc``: build the config, load it (waiting for every model), then serve
gRPC (on --port and/or --grpc_socket_path, TLS with --ssl_config_file) and, on its own
port, REST (with the Prometheus page of --monitoring_config_file) on one asyncio loop.
The server config files are read before any model loads (TF Serving reads them after).
SIGTERM/SIGINT stop serving and exit 0. A flag mistake exits 2, a failed start 1.

--enable_batching is refused (exit 2): the node does no server-side batching, and a
user who asks for it must not get a server that silently runs each request alone.

Accepted for compatibility and ignored: --num_unload_threads above 0 unloads on a
pool as TF Serving does. --enable_model_warmup (default true) replays
assets.extra/tf_serving_warmup_requests during each load, --num_request_iterations_for_warmup
times per record (0: once), as TF Serving does (tfscache/modelserver/warmup.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("tfscache.modelserver.main")


@dataclass(frozen=True)
class Flag:
    default: object
    help: str


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


FLAGS: dict[str, Flag] = {
    "port": Flag(8500, "gRPC port (0: pick a free one when --ports_file is given)"),
    "grpc_socket_path": Flag("", "also serve gRPC on this UNIX socket (unix:PATH)"),
    "ssl_config_file": Flag("", "text-format SSLConfig: serve gRPC over TLS"),
    "monitoring_config_file": Flag(
        "", "text-format MonitoringConfig: Prometheus page on the REST port"
    ),
    "rest_api_port": Flag(0, "REST port; 0 turns REST off (without --ports_file)"),
    "rest_api_timeout_in_ms": Flag(30000, "session-run timeout for REST requests"),
    "rest_api_num_threads": Flag(0, "accepted; REST runs on the asyncio loop"),
    "rest_api_enable_cors_support": Flag(False, "accepted for compatibility"),
    "model_config_file": Flag(
        "", "text-format ModelServerConfig; overrides --model_name/--model_base_path"
    ),
    "model_config_file_poll_wait_seconds": Flag(
        0, "re-read --model_config_file this often (0: never)"
    ),
    "model_name": Flag("default", "model name with --model_base_path"),
    "model_base_path": Flag("", "base path of the single model"),
    "file_system_poll_wait_seconds": Flag(1.0, "poll base paths this often (0: once; <0: never)"),
    "max_num_load_retries": Flag(5, "retries after a failed load"),
    "load_retry_interval_micros": Flag(60_000_000, "wait between load retries"),
    "num_load_threads": Flag(0, "0: load serially on the manager thread"),
    "num_unload_threads": Flag(0, "0: unload on the manager thread"),
    "enable_model_warmup": Flag(
        True, "replay assets.extra/tf_serving_warmup_requests during the load"
    ),
    "num_request_iterations_for_warmup": Flag(0, "replays of each warm-up record (0: once)"),
    "allow_version_labels_for_unavailable_models": Flag(
        False, "allow new labels on unavailable versions"
    ),
    "saved_model_tags": Flag("serve", "comma-separated MetaGraphDef tags to load"),
    "grpc_channel_arguments": Flag("", "k=v,k=v gRPC server arguments"),
    "flush_filesystem_caches": Flag(True, "accepted for compatibility"),
    "enable_batching": Flag(False, "refused when true: no server-side batching"),
    "enable_signature_method_name_check": Flag(False, "accepted for compatibility"),
    "enable_serialization_as_tensor_content": Flag(False, "accepted for compatibility"),
    # tfscache extensions (docs/DESIGN.md)
    "bind_address": Flag("0.0.0.0", "address both servers bind to"),
    "ports_file": Flag("", "write {grpc, rest, pid} JSON here once serving; port 0 = free port"),
    "load_gate_dir": Flag("", "fault injection for tests (see docs/DESIGN.md)"),
    "max_request_tensor_bytes": Flag(
        2**30,
        "bound on a request's decoded tensors, in bytes "
        "(RESOURCE_EXHAUSTED above it; 0: no bound)",
    ),
}


class FlagError(ValueError):
    pass


def parse_flags(argv: list[str]) -> dict[str, object]:
    """--flag=value, --flag value, and --flag / --flag=true|false for booleans."""
    values = {name: flag.default for name, flag in FLAGS.items()}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg in ("-", "--"):
            raise FlagError(f"Unknown argument {arg}")
        name, has_value, text = arg.lstrip("-").partition("=")
        if name not in FLAGS:
            raise FlagError(f"Unknown argument {arg}")
        default = FLAGS[name].default
        if not has_value:
            if isinstance(default, bool) and (not args or args[0].lower() not in ("true", "false")):
                text = "true"
            elif not args:
                raise FlagError(f"Flag --{name} needs a value")
            else:
                text = args.pop(0)
        try:
            values[name] = _convert(default, text)
        except ValueError as exc:
            raise FlagError(f"Illegal value for flag --{name}: {text!r} ({exc})") from exc
    return values


def _convert(default: object, text: str) -> object:
    if isinstance(default, bool):
        return _bool(text)
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


def usage() -> str:
    lines = [
        "usage: tfscache node [--flag=value ...]",
        "",
        "Flags (tensorflow_model_server's, plus tfscache's):",
    ]
    for name, flag in FLAGS.items():
        lines.append(f"  --{name}={flag.default!s:<10}  {flag.help}")
    return "\n".join(lines)


def _initial_config(flags: dict[str, object]):
    from tfscache.modelserver import config as node_config

    if flags["model_config_file"]:
        return node_config.read_model_server_config(flags["model_config_file"])
    if not flags["model_base_path"]:
        raise node_config.InvalidArgument(
            "Both server_options.model_base_path and server_options.model_config_file are empty!")
    return node_config.single_model_config(flags["model_name"], flags["model_base_path"])


def _manager_options(flags: dict[str, object]):
    from tfscache.modelserver.server_core import ManagerOptions

    return ManagerOptions(
        file_system_poll_wait_seconds=flags["file_system_poll_wait_seconds"],
        max_num_load_retries=flags["max_num_load_retries"],
        load_retry_interval_micros=flags["load_retry_interval_micros"],
        num_load_threads=flags["num_load_threads"],
        num_unload_threads=flags["num_unload_threads"],
        allow_version_labels_for_unavailable_models=flags[
            "allow_version_labels_for_unavailable_models"
        ],
        load_gate_dir=flags["load_gate_dir"] or None,
        saved_model_tags=tuple(t for t in str(flags["saved_model_tags"]).split(",") if t),
        warmup_iterations=(
            max(int(flags["num_request_iterations_for_warmup"]), 1)
            if flags["enable_model_warmup"]
            else None
        ),
    )


class _RefusePlotting:
    """An import finder refusing matplotlib (see ``no_plotting``)."""

    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("a tfscache node never plots")
        return None


def no_plotting() -> None:
    """Keras, which TensorFlow imports eagerly, imports matplotlib.pyplot when it is installed
    (~0.7 s of every node's start); a node never plots."""
    if "matplotlib" not in sys.modules and not any(
        isinstance(f, _RefusePlotting) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _RefusePlotting())


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help", "-help") for arg in argv):
        print(usage())
        return 0
    no_plotting()
    if os.environ.get("TFSCACHE_LOG_JSON") == "1":  # set by `tfscache serve --log-json`
        from tfscache import logs

        logs.setup("INFO", json_lines=True)
    else:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    try:
        flags = parse_flags(argv)
        check_flags(flags)
    except FlagError as exc:
        print(f"{exc}\n\n{usage()}", file=sys.stderr)
        return 2
    from tfscache.errors import TfscacheError, code_name
    from tfscache.modelserver.config import ConfigParseError
    from tfscache.modelserver.server_configs import ConfigFileError, load_server_configs

    try:
        config = _initial_config(flags)
        server_configs = load_server_configs(str(flags["ssl_config_file"]),
                                             str(flags["monitoring_config_file"]))
    except ConfigParseError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    except ConfigFileError as exc:  # protobuf's log line, then TF Serving's status
        print(f"{exc.detail}\nFailed to start server. Error: INVALID_ARGUMENT: {exc.message}",
              file=sys.stderr)
        return 1
    except TfscacheError as exc:
        print(
            f"Failed to start server. Error: {code_name(exc.grpc_code)}: {exc.message}",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"Failed to start server. Error: {exc}", file=sys.stderr)
        return 1
    return _serve(flags, config, server_configs)


def check_flags(flags: dict[str, object]) -> None:
    """Flag values that are wrong whatever else is given; FlagError names the flag."""
    if int(flags["max_request_tensor_bytes"]) < 0:
        raise FlagError("Illegal value for flag --max_request_tensor_bytes: "
                        f"{flags['max_request_tensor_bytes']} (must be >= 0)")
    # a bind to 99999 would fail only after the models loaded
    for name in ("port", "rest_api_port"):
        if not 0 <= int(flags[name]) <= 65535:
            raise FlagError(
                f"Illegal value for flag --{name}: {flags[name]} (must be a port number 0..65535)"
            )
    if flags["enable_batching"]:
        raise FlagError("Illegal value for flag --enable_batching: true (tfscache node does no "
                        "server-side batching: each request runs in its own Session::Run; batch "
                        "on the client, or serve with tensorflow_model_server; see docs/node.md)")


@dataclass
class _Node:
    """The running servers, for the signal handler and the config-file poller."""

    flags: dict[str, object]
    core: object
    configs: object  # server_configs.ServerConfigs
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def _serve(flags: dict[str, object], config, server_configs) -> int:
    from tfscache.errors import TfscacheError, code_name
    from tfscache.modelserver.server_core import ServingCore

    core = ServingCore(_manager_options(flags))
    try:
        core.reload(config)
    except TfscacheError as exc:
        print(f"Failed to start server. Error: {code_name(exc.grpc_code)}: {exc.message}",
              file=sys.stderr)
        core.stop()
        return _exit(1)
    # TF's modules hold millions of objects; freezing them keeps the full collection
    # that follows every unload fast (it then scans only objects made after start-up).
    gc.freeze()
    rc = asyncio.run(_run_servers(_Node(flags, core, server_configs)))
    core.stop()
    return _exit(rc)


def _exit(rc: int) -> int:
    """Leave at once: a reload hung on a missing base path (as in TF Serving) or a TF
    thread must not keep a stopped node alive."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


async def _run_servers(node: _Node) -> int:
    from tfscache.modelserver import config as node_config
    from tfscache.modelserver.grpc_api import bind_ports, build_server

    flags = node.flags
    ports_file = str(flags["ports_file"])
    bind = str(flags["bind_address"])
    executor = concurrent.futures.ThreadPoolExecutor(
        max(4, 4 * (os.cpu_count() or 1)), thread_name_prefix="tfscache-rpc")
    channel_arguments = node_config.parse_channel_arguments(str(flags["grpc_channel_arguments"]))
    server = build_server(node.core, executor, channel_arguments,
                          int(flags["max_request_tensor_bytes"]) or None)
    tcp_address = f"{_host(bind)}:{flags['port']}"
    if int(flags["port"]) == 0 and flags["grpc_socket_path"] and not ports_file:
        tcp_address = ""  # TF Serving: --port=0 with a socket path serves gRPC on the socket only
    grpc_port = bind_ports(
        server, tcp_address, str(flags["grpc_socket_path"]), node.configs.credentials
    )
    if grpc_port is None:  # logged by bind_ports
        print(
            "Failed to start server. Error: INVALID_ARGUMENT: Failed to BuildAndStart gRPC server",
            file=sys.stderr,
        )
        return 1
    await server.start()
    if grpc_port:
        log.info("Running gRPC ModelServer at %s:%d ...", bind, grpc_port)
    if flags["grpc_socket_path"]:
        log.info("Running gRPC ModelServer at UNIX socket %s ...", flags["grpc_socket_path"])
    rest_runner, rest_port = await _start_rest(node, grpc_port)
    if ports_file:
        _write_ports_file(Path(ports_file), grpc_port, rest_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop.set)
    poller = _start_config_file_poller(node, loop)
    await node.stop.wait()
    log.info("Stopping the model server")
    if poller is not None:
        poller.set()
    await server.stop(grace=1.0)
    if rest_runner is not None:
        await rest_runner.cleanup()
    executor.shutdown(wait=False, cancel_futures=True)
    return 0


def _host(bind: str) -> str:
    return f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind


async def _start_rest(node: _Node, grpc_port: int):
    """REST on --rest_api_port (0 = off, unless --ports_file asks for a free port)."""
    flags = node.flags
    port = int(flags["rest_api_port"])
    if port == 0 and not flags["ports_file"]:
        return None, 0
    if port != 0 and port == int(flags["port"]):
        log.warning("--rest_api_port equals --port; not starting the REST API server")
        return None, 0
    from aiohttp import web

    from tfscache.webserver import app_runner

    try:
        from tfscache.modelserver.rest_api import make_rest_app  # imported only when REST is on
    except ImportError:
        log.exception("REST API unavailable: tfscache.modelserver.rest_api cannot be imported")
        return None, 0

    app = make_rest_app(node.core, timeout_ms=int(flags["rest_api_timeout_in_ms"]),
                        max_tensor_bytes=int(flags["max_request_tensor_bytes"]) or None,
                        metrics_path=node.configs.metrics_path)
    runner = app_runner(app, "REST API")  # unparsable requests refused quietly (414/431/400)
    await runner.setup()
    site = web.TCPSite(runner, str(flags["bind_address"]), port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
    log.info("Exporting HTTP/REST API at:%s:%d ...", flags["bind_address"], bound)
    return runner, bound


def _write_ports_file(path: Path, grpc_port: int, rest_port: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"grpc": grpc_port, "rest": rest_port, "pid": os.getpid()}))
    os.replace(tmp, path)


def _start_config_file_poller(node: _Node, loop) -> threading.Event | None:
    """--model_config_file_poll_wait_seconds: re-apply the file; errors are only logged."""
    flags = node.flags
    period = float(flags["model_config_file_poll_wait_seconds"])
    if period <= 0 or not flags["model_config_file"]:
        return None
    stopped = threading.Event()

    def poll() -> None:
        from tfscache.errors import TfscacheError
        from tfscache.modelserver.config import read_model_server_config

        while not stopped.wait(period):
            try:
                node.core.reload(read_model_server_config(flags["model_config_file"]))
            except (TfscacheError, OSError) as exc:
                log.error("Failed to reload the model config file %s: %s",
                          flags["model_config_file"], exc)

    threading.Thread(target=poll, name="tfscache-config-poll", daemon=True).start()
    return stopped
