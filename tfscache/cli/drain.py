"""``tfscache drain``: drain one node, or a whole tfscache, through its admin API, and follow it.

    tfscache drain --address 10.0.0.3:8502                  # a sidecar drains and exits: wait for it
    tfscache drain --address tfscache-3 --address-template '{node}.tfscache:8502'
    tfscache drain --address 127.0.0.1:8502 --node node1    # embedded: one local node leaves the ring

The drain (``tfscache.admin.Admin/Drain``): health NOT_SERVING and out of discovery, requests
in flight finish, every model is unloaded, and the process exits 0. With ``--node`` only that
local node leaves the ring and empties; the process goes on. For a whole-process drain the
command then waits until the process has gone (its admin port refuses connections).

A progress bar on stderr counts the models unloaded (``--progress``/``--no-progress``/
``--quiet``: tfscache.cli.options). Exit status 0 when drained, 1 when the drain failed or the
process did not go within ``--exit-timeout``, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc
from tqdm import tqdm

from tfscache.admin.client import DEFAULT_ADDRESS, AdminClient, AdminError
from tfscache.cli.options import (
    Parser,
    add_admin_flags,
    add_output_flags,
    bar_disable,
    host_port,
    non_negative,
    positive,
)

def follow(client: AdminClient, node: str, grace_s: float, disable: bool | None) -> None:
    """Start the drain and move a bar along with its progress until it is done."""
    with tqdm(total=0, desc="draining", unit="model", disable=disable, file=sys.stderr) as bar:
        for p in client.drain(node, grace_s):
            bar.total = max(bar.total or 0, p.models_total)
            bar.n = p.models_total - p.models_left
            bar.set_postfix_str(f"{p.phase}, {p.leases} leases", refresh=False)
            bar.refresh()


def wait_gone(address: str, token: str, timeout_s: float) -> bool:
    """True once the admin API at ``address`` refuses connections (the process exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with AdminClient(address, token=token, timeout_s=2) as client:
                client.list_models()
        except AdminError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                return True
        time.sleep(0.2)  # an operator's poll of another process; there is nothing to wait on
    return False


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tfscache drain", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_admin_flags(parser, DEFAULT_ADDRESS, ring_names=True)
    parser.add_argument(
        "--node", default="", help="embedded mode: drain only this local node (node0, ...)"
    )
    parser.add_argument(
        "--grace",
        type=non_negative(float),
        default=0.0,
        help="longest wait for requests in flight, s (default: the server's server.grace_s)",
    )
    parser.add_argument(
        "--exit-timeout",
        type=positive(float),
        default=60.0,
        help="after a process drain, how long to wait for the process to go, s (default %(default)s)",
    )
    add_output_flags(parser, summary=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    if args.address_template:
        if "{node}" not in args.address_template:
            parser.error(f"argument --address-template: {args.address_template!r} lacks {{node}}")
        address = args.address_template.replace("{node}", args.address)
    else:
        address = args.address
    try:
        host_port(address)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"argument --address: {exc}" + ("" if args.address_template else
                                                     " (give --address-template for ring names)"))
    try:
        with AdminClient(address, token=args.token) as client:
            follow(client, args.node, args.grace, bar_disable(args))
    except AdminError as exc:
        print(f"tfscache drain: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    if args.node:
        print(f"drained node {args.node} of {address}")
        return 0
    if not wait_gone(address, args.token, args.exit_timeout):
        print(
            f"tfscache drain: {address} drained but still answers after {args.exit_timeout:g} s",
            file=sys.stderr,
        )
        return 1
    print(f"drained {address}; the process exited")
    return 0
