"""``tfscache models|pin|unpin|preload|evict|join``: the admin API from the command line.

    tfscache models --address 127.0.0.1:8502
    tfscache pin addk_1 --version 1 --node node0
    tfscache evict addk_1
    tfscache join                           # a sidecar started with --no-join: register, go on the ring

Every subcommand takes ``--address`` (default 127.0.0.1:8502, or TFSCACHE_ADMIN_ADDRESS)
and ``--token`` (or TFSCACHE_ADMIN_TOKEN). Exit status: 0 on success, 1 when the
server refused (its gRPC code and message on stderr), 2 on bad arguments. ``tfscache drain``,
which follows a drain to its end, is tfscache.cli.drain.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tfscache.admin.client import DEFAULT_ADDRESS, AdminClient, AdminError
from tfscache.cli.options import Parser, add_admin_flags, non_negative


def _parser(command: str) -> argparse.ArgumentParser:
    parser = Parser(prog=f"tfscache {command}", description=_HELP[command])
    add_admin_flags(parser, DEFAULT_ADDRESS)
    if command == "join":
        return parser
    parser.add_argument(
        "--node", default="", help="one node of that tfscache (default: see the command)"
    )
    if command == "models":
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    else:
        parser.add_argument("model", help="model name")
        parser.add_argument(
            "--version",
            type=non_negative(int),
            default=0,
            help="model version (default: the highest on disk, or every resident one)",
        )
        if command in ("pin", "preload"):
            parser.add_argument(
                "--timeout",
                type=non_negative(float),
                default=0.0,
                help="longest wait for the load, s (default: the server's cache.load_timeout_s)",
            )
    return parser


_HELP = {
    "models": "list the models resident on each node: size, leases, last use, pinned",
    "pin": "load a model if needed and never evict it",
    "unpin": "let the eviction policy evict a pinned model again",
    "preload": "load a model and wait until it is AVAILABLE",
    "evict": "unload an idle model now",
    "join": "register a sidecar started with --no-join with discovery: it goes on the ring",
}


def _age(last_use: float) -> str:
    return "-" if not last_use else f"{max(0.0, time.time() - last_use):.0f}s ago"


def _print_models(response, as_json: bool) -> None:
    if as_json:
        from google.protobuf.json_format import MessageToDict

        print(
            json.dumps(MessageToDict(response, always_print_fields_with_no_presence=True), indent=2)
        )
        return
    for node in response.nodes:
        flags = [w for w, on in (("healthy", node.healthy), ("unhealthy", not node.healthy),
                                 ("draining", node.draining)) if on]
        print(
            f"node {node.node} ({', '.join(flags)}; {len(node.models)} resident, {node.queued} queued)"
        )
        for m in node.models:
            size = f"{m.bytes}{'' if m.measured else ' (est.)'}"
            print(
                f"  {m.name:<30} v{m.version:<6} {m.state:<10} {size:>20} B  leases {m.leases:<3} "
                f"last use {_age(m.last_use)}{'  pinned' if m.pinned else ''}"
            )


def _print_results(verb: str, response) -> None:
    for result in response.results:
        for m in result.models:
            print(
                f"{verb} {m.name} version {m.version} on node {result.node} ({m.bytes} bytes, {m.state}"
                f"{', pinned' if m.pinned else ''})"
            )


def main_for(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    try:
        with AdminClient(args.address, token=args.token) as client:
            if command == "models":
                _print_models(client.list_models(args.node), args.json)
            elif command == "join":
                print(client.join().message)
            else:
                method = getattr(client, command)
                kwargs = (
                    {"timeout_s": args.timeout or None} if command in ("pin", "preload") else {}
                )
                _print_results(
                    {"pin": "pinned", "unpin": "unpinned", "preload": "loaded", "evict": "evicted"}[
                        command
                    ],
                    method(args.model, args.version or None, args.node, **kwargs),
                )
    except AdminError as exc:
        print(f"tfscache {command}: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    return 0


def _command(name: str):
    return lambda argv=None: main_for(name, sys.argv[2:] if argv is None else argv)


models_main = _command("models")
pin_main = _command("pin")
unpin_main = _command("unpin")
preload_main = _command("preload")
evict_main = _command("evict")
join_main = _command("join")
