"""`tfscache status`: what a running `tfscache serve` holds, read from its metrics port.

    tfscache status --address 127.0.0.1:8503          # tables
    tfscache status --address 127.0.0.1:8503 --json   # the /status document, for scripts

Prints the nodes (health, models, bytes, leases, queued loads), every resident model
with its size, last use and leases, and the hit ratio. Exit status 1 when the
server cannot be read. Only the standard library: no tensorflow, no aiohttp.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

DEFAULT_ADDRESS = os.environ.get("TFSCACHE_STATUS_ADDRESS", "127.0.0.1:8503")


def fetch(address: str, timeout: float = 10.0) -> dict[str, Any]:
    """The /status document of the serve whose metrics port is ``address`` (HOST:PORT)."""
    with urllib.request.urlopen(f"http://{address}/status", timeout=timeout) as reply:
        return json.loads(reply.read())


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return ["  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def render(doc: dict[str, Any]) -> str:
    """The document as the tables `tfscache status` prints."""
    ring = doc.get("ring", {})
    lines = [f"nodes (ring: {len(ring.get('nodes', []))} node(s), {ring.get('replicas', 0)} replica(s) per model)"]
    rows = []
    for node in doc["nodes"]:
        local = node["kind"] == "node"
        rows.append([node["name"], node["kind"], node.get("address") or "-",
                     "yes" if node["healthy"] else "NO",
                     str(node["resident_models"]) if local else "-",
                     human_bytes(node["resident_bytes"]) if local else "-",
                     str(node["leases"]) if local else "-", str(len(node["queue"])) if local else "-"])
    lines += _table(["NODE", "KIND", "ADDRESS", "HEALTHY", "MODELS", "BYTES", "LEASES", "QUEUED"], rows)
    rows = []
    for node in doc["nodes"]:
        for m in node.get("models", []):
            size = human_bytes(m["bytes"]) + ("" if m["measured"] else " (estimated)")
            rows.append([node["name"], m["name"], str(m["version"]), m["state"], size,
                         ago(doc["time"] - m["last_use"]), str(m["leases"])])
    lines += ["", f"resident models ({len(rows)})"]
    lines += _table(["NODE", "MODEL", "VERSION", "STATE", "SIZE", "LAST USE", "LEASES"], rows) if rows else ["  none"]
    hits, misses, ratio = doc["hits"], doc["misses"], doc["hit_ratio"]
    shown = "n/a (no requests yet)" if ratio is None else f"{100 * ratio:.1f}%"
    lines += ["", f"hit ratio: {shown} ({hits} hit{'s' if hits != 1 else ''}, "
                  f"{misses} miss{'es' if misses != 1 else ''})"]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfscache status",
                                     description="Show nodes, resident models, leases and the hit ratio "
                                                 "of a running tfscache serve (read from its metrics port).")
    parser.add_argument("--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT",
                        help=f"the serve's metrics port (server.metrics_port; default {DEFAULT_ADDRESS}, "
                             "or $TFSCACHE_STATUS_ADDRESS)")
    parser.add_argument("--json", action="store_true", help="print the raw /status document")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        doc = fetch(args.address, args.timeout)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"tfscache status: cannot read http://{args.address}/status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0
