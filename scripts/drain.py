#!/usr/bin/env python
"""Drain one tfscache through its admin API and follow it to completion.

    .venv/bin/python scripts/drain.py 10.0.0.3:8502                     # a sidecar: drains and exits 0
    .venv/bin/python scripts/drain.py tfscache-3 --address-template '{node}.tfscache:8502'
    .venv/bin/python scripts/drain.py 127.0.0.1:8502 --node node1       # embedded: one local node

NODE is the admin API's HOST:PORT, or a ring name turned into one by ``--address-template``.
The drain (``tfscache.admin.Admin/Drain``): health NOT_SERVING and out of discovery,
requests in flight finish, every model is unloaded, and the process exits 0 (``--node``:
only that local node leaves the ring and empties; the process goes on). A progress bar
on stderr counts the models unloaded; for a whole-process drain the script then waits
until the process has gone (its admin port refuses connections). Exit status 0 when
drained, 1 when the drain failed or the process did not go within ``--exit-timeout``,
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import grpc
from tqdm import tqdm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tfscache.admin.client import AdminClient, AdminError  # noqa: E402


def follow(client: AdminClient, node: str, grace_s: float, progress: bool | None) -> None:
    """Start the drain and move a bar along with its progress until it is done."""
    quiet = None if progress is None else not progress
    with tqdm(total=0, desc="draining", unit="model", disable=quiet, file=sys.stderr) as bar:
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
    parser = argparse.ArgumentParser(prog="drain.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar="NODE", help="admin API HOST:PORT, or a ring name with --address-template")
    parser.add_argument("--address-template", default="", help="e.g. '{node}.tfscache:8502'")
    parser.add_argument("--node", default="", help="embedded mode: drain only this local node (node0, ...)")
    parser.add_argument("--token", default=os.environ.get("TFSCACHE_ADMIN_TOKEN", ""), help="admin token")
    parser.add_argument("--grace", type=float, default=0.0, help="longest wait for requests in flight, s "
                        "(default: the server's server.grace_s)")
    parser.add_argument("--exit-timeout", type=float, default=60.0,
                        help="after a process drain, how long to wait for the process to go (default %(default)s)")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", default=None, help="always show the progress bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    address = args.address_template.format(node=args.target) if args.address_template else args.target
    if ":" not in address:
        print(f"drain.py: {address!r} is not HOST:PORT (give --address-template for ring names)", file=sys.stderr)
        return 2
    try:
        with AdminClient(address, token=args.token) as client:
            follow(client, args.node, args.grace, args.progress)
    except AdminError as exc:
        print(f"drain.py: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    if args.node:
        print(f"drained node {args.node} of {address}")
        return 0
    if not wait_gone(address, args.token, args.exit_timeout):
        print(f"drain.py: {address} drained but still answers after {args.exit_timeout} s", file=sys.stderr)
        return 1
    print(f"drained {args.target}; the process exited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
