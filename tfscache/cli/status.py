"""`tfscache status`: what a running `tfscache serve` holds, read from its metrics port.

    tfscache status --address 127.0.0.1:8503          # tables
    tfscache status --address 127.0.0.1:8503 --json   # the /status document, for scripts

Prints the nodes, the worker processes (``--workers N``: pid, requests in flight under its
delegations, restarts, delegations held, requests answered), every model version in a node's config
with its state, tier (docs/tiers.md), size, last use
and leases, and the hit ratio. Exit status 1 when the server cannot be read. Only the
standard library: no tensorflow, no aiohttp. It shows no progress, so it has no
``--quiet``/``--progress`` (tfscache.cli.options); bad flags exit 2.

A node's row counts its versions by state apart: AVAILABLE (serving; BYTES is theirs),
LOADING and UNLOADING. CAP reads "in use/cap" for each cap the node has, where in use is
loading + available (the versions that count against the caps; a victim stops counting
when it turns unloading): ``3/3`` for max_models=3, ``1.5 GiB/2.0 GiB`` for a memory cap,
``none`` without caps, and ``over`` after it while a cap is exceeded. So a node capped at
3 models that is swapping one in reads AVAILABLE 2, LOADING 1, UNLOADING 1, CAP 3/3.
UNLOADS/MIN is the node's capacity unloads per minute, and the "scale advice" line says
whether to add nodes (+1), hold (0) or remove one (-1), and why (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from tfscache.cli.options import Parser, add_token_flag, host_port, positive
from tfscache.units import format_bytes

DEFAULT_ADDRESS = os.environ.get("TFSCACHE_STATUS_ADDRESS", "127.0.0.1:8503")


def fetch(address: str, timeout: float = 10.0, token: str = "") -> dict[str, Any]:
    """The /status document of the serve whose metrics port is ``address`` (HOST:PORT);
    ``token``: the admin token, when the serve has one (server.admin_token)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{address}/status", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return [
        "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
        for row in [header, *rows]
    ]


def _state_counts(node: dict[str, Any]) -> list[str]:
    states = node.get("model_states")
    if states is None:  # a serve from before the states were apart: its count included them all
        return [str(node["resident_models"]), "?", "?"]
    return [str(states[state]["models"]) for state in ("available", "loading", "unloading")]


def cap_text(node: dict[str, Any]) -> str:
    """A local node's CAP cell: "in use/cap" per cap (in use = loading + available), "over" if exceeded."""
    states, caps = node.get("model_states"), node.get("caps")
    if states is None or caps is None:
        return "-"  # the node is down (or the serve is older): caps unknown
    count = states["loading"]["models"] + states["available"]["models"]
    size = states["loading"]["bytes"] + states["available"]["bytes"]
    parts, over = [], False
    if caps["max_models"]:
        parts.append(f"{count}/{caps['max_models']}")
        over = count > caps["max_models"]
    if caps["memory_bytes"]:
        parts.append(f"{format_bytes(size)}/{format_bytes(caps['memory_bytes'])}")
        over = over or size > caps["memory_bytes"]
    if not parts:
        return "none"
    return " ".join(parts) + (" over" if over else "")


_ADVICE = {1: "+1 (more nodes)", 0: "0 (hold)", -1: "-1 (fewer nodes)"}


def _rate(node: dict[str, Any]) -> str:
    rate = node.get("unloads_per_minute")
    return "-" if rate is None else f"{rate:.1f}"


def render(doc: dict[str, Any]) -> str:
    """The document as the tables `tfscache status` prints."""
    ring = doc.get("ring", {})
    lines = [
        f"nodes (ring: {len(ring.get('nodes', []))} node(s), {ring.get('replicas', 0)} replica(s) per model)"
    ]
    rows = []
    for node in doc["nodes"]:
        local = node["kind"] == "node"
        counts = _state_counts(node) if local else ["-", "-", "-"]
        rows.append(
            [
                node["name"],
                node["kind"] + ("/host" if node.get("tier") == "host" else ""),  # docs/tiers.md
                node.get("address") or "-",
                "yes" if node["healthy"] else "NO",
                *counts,
                cap_text(node) if local else "-",
                format_bytes(node["resident_bytes"]) if local else "-",
                str(node["leases"]) if local else "-",
                str(len(node["queue"])) if local else "-",
                _rate(node) if local else "-",
            ]
        )
    lines += _table(
        [
            "NODE",
            "KIND",
            "ADDRESS",
            "HEALTHY",
            "AVAILABLE",
            "LOADING",
            "UNLOADING",
            "CAP",
            "BYTES",
            "LEASES",
            "QUEUED",
            "UNLOADS/MIN",
        ],
        rows,
    )
    lines += _workers(doc)
    rows = []
    for node in doc["nodes"]:
        for m in node.get("models", []):
            size = format_bytes(m["bytes"]) + ("" if m["measured"] else " (estimated)")
            rows.append([node["name"], m["name"], str(m["version"]), m["state"], _tier(m), size,
                         ago(doc["time"] - m["last_use"]), str(m["leases"])])
    lines += ["", f"model versions ({len(rows)})"]
    lines += (
        _table(["NODE", "MODEL", "VERSION", "STATE", "TIER", "SIZE", "LAST USE", "LEASES"], rows)
        if rows
        else ["  none"]
    )
    lines += _copies(doc)
    scale = doc.get("scale")
    if scale is not None:  # absent from a serve older than the scaling signal
        lines += [
            "",
            f"scale advice: {_ADVICE.get(scale['advice'], scale['advice'])}: {scale['reason']} "
            f"(capacity unloads per minute over {scale['window_s']:g} s)",
        ]
    tier = doc.get("disk_tier")
    if tier is not None:  # a model repository in a bucket (docs/storage.md)
        lines += [
            "",
            f"disk tier {tier['directory']} for {tier['url']}: {format_bytes(tier['bytes'])} of "
            f"{format_bytes(tier['cap_bytes'])}, {tier['versions']} "
            f"version{'s' if tier['versions'] != 1 else ''}"
            f" ({tier['in_use']} in use by nodes), {tier['downloads_in_flight']} downloading",
        ]
    for node in doc["nodes"]:
        if node.get("prefetch"):  # co-access prefetch on (docs/prefetch.md)
            lines += [
                "",
                f"prefetch on {node['name']}: "
                + ", ".join(f"{v} {k}" for k, v in node["prefetch"].items()),
            ]
    hits, misses, ratio = doc["hits"], doc["misses"], doc["hit_ratio"]
    shown = "n/a (no requests yet)" if ratio is None else f"{100 * ratio:.1f}%"
    lines += ["", f"hit ratio: {shown} ({hits} hit{'s' if hits != 1 else ''}, "
                  f"{misses} miss{'es' if misses != 1 else ''})"]
    return "\n".join(lines)


def _tier(model: dict[str, Any]) -> str:
    """Where a version is resident (docs/tiers.md), "gpu->host" while it moves; "-" from a serve
    older than the tiers."""
    tier, moving = model.get("tier"), model.get("moving")
    return "-" if tier is None else f"{tier}->{moving}" if moving else tier


def _workers(doc: dict[str, Any]) -> list[str]:
    """The worker processes of a serve with ``--workers N`` (none: nothing, as with one process)."""
    workers = doc.get("workers")
    if not workers:
        return []
    rows = [
        [
            str(w["id"]),
            str(w.get("pid") or "-"),
            str(w.get("in_flight", 0)),
            str(w.get("restarts", 0)),
            str(w.get("delegations", 0)),
            str(w.get("requests", "-")),
        ]
        for w in workers
    ]
    in_flight = sum(int(w.get("in_flight", 0)) for w in workers)
    return [
        "",
        f"workers ({len(workers)}, {in_flight} request{'s' if in_flight != 1 else ''} in flight)",
        *_table(["WORKER", "PID", "IN FLIGHT", "RESTARTS", "DELEGATIONS", "REQUESTS"], rows),
    ]


def _copies(doc: dict[str, Any]) -> list[str]:
    """Each resident model's copies: where it is resident here, and the extra copies routing uses."""
    copies = doc.get("copies")
    resident: dict[str, list[str]] = {}
    for node in doc["nodes"]:
        for m in node.get("models", []):
            if m["state"] != "unloading" and node["name"] not in resident.setdefault(m["name"], []):
                resident[m["name"]].append(node["name"])
    extra = copies["models"] if copies is not None else {}
    names = sorted({*resident, *extra})
    if not names:
        return []
    title = (
        f"model copies (copies follow load: {copies['min']} to {copies['max'] or 'every node'} per model)"
        if copies is not None
        else "model copies (fixed replicas)"
    )
    rows = [
        [
            name,
            str(len(extra.get(name, ())) or _ring_copies(doc)),
            ", ".join(extra.get(name, ())) or "-",
            ", ".join(resident.get(name, ())) or "-",
        ]
        for name in names
    ]
    return ["", title, *_table(["MODEL", "COPIES", "COPIES ON", "RESIDENT ON"], rows)]


def _ring_copies(doc: dict[str, Any]) -> int:
    """Copies of a model with no extra ones: the ring's replicas (the copies' minimum)."""
    return int(doc.get("ring", {}).get("replicas", 1))


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tfscache status",
                    description="Show nodes, resident models, leases and the hit ratio "
                                "of a running tfscache serve (read from its metrics port).")
    parser.add_argument(
        "--address",
        type=host_port,
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help=f"the serve's metrics port (server.metrics_port; default {DEFAULT_ADDRESS}, "
        "or $TFSCACHE_STATUS_ADDRESS)",
    )
    parser.add_argument("--json", action="store_true", help="print the raw /status document")
    add_token_flag(parser)
    parser.add_argument(
        "--timeout", type=positive(float), default=10.0, help="seconds to wait for the answer"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        doc = fetch(args.address, args.timeout, token=args.token)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"tfscache status: cannot read http://{args.address}/status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0
