"""``Peer``: one tfscache sidecar as the others reach it, and the parser of a peer list.

A leaf module (it imports nothing of tfscache), so that ``tfscache.settings`` can parse
``[ring] peers`` and every discovery backend can build peers without a cycle.

    parse_peers([{"name": "a", "grpc": "10.0.0.1:8500", "rest": "10.0.0.1:8501"}])
    parse_peers("a=10.0.0.1:8500/10.0.0.1:8501,b=10.0.0.2:8500")   # env / CLI form
    parse_peers("h=10.0.0.3:8500/10.0.0.3:8501/host")   # a host-tier sidecar (docs/tiers.md)
    parse_dns_server("127.0.0.1:5353")   # ("127.0.0.1", 5353): discovery.dns_server
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


TIERS = ("gpu", "host")  # a sidecar's node's tier (tfscache.cache.tiers names them too)


@dataclass
class Peer:
    """A tfscache sidecar on the ring (sidecar mode): its name and its gRPC and REST addresses."""

    name: str
    grpc: str
    rest: str = ""
    tier: str = "gpu"  # "host": a host-tier sidecar, off the ring (docs/tiers.md)


def is_address(value: str) -> bool:
    """``HOST:PORT`` (or empty: not given)."""
    return not value or re.fullmatch(r"[^\s,]+:\d{1,5}", value) is not None


def parse_peers(value: Any) -> list[Peer]:
    """A list of ``{name, grpc, rest, tier}`` tables (``tier`` optional: ``gpu``, the default, or
    ``host``), or the ``name=grpc/rest/tier,...`` string; ValueError if bad."""
    if isinstance(value, str):
        value = [{k: v for k, v in zip(("name", "grpc", "rest", "tier"), re.split(r"[=/]", item))
                  if k != "tier" or v}
                 for item in value.split(",") if item]
    peers = []
    for item in value:
        if (
            not isinstance(item, Mapping)
            or set(item) - {"name", "grpc", "rest", "tier"}
            or not item.get("name")
        ):
            raise ValueError("each peer is {name, grpc, rest, tier}")
        for key in ("grpc", "rest"):
            if not is_address(str(item.get(key, ""))):
                raise ValueError(f"peer {item['name']}: {key} must be HOST:PORT")
        tier = str(item.get("tier", "gpu"))
        if tier not in TIERS:
            raise ValueError(f"peer {item['name']}: tier must be gpu or host")
        peers.append(Peer(str(item["name"]), str(item.get("grpc", "")), str(item.get("rest", "")),
                          tier))
    if len({p.name for p in peers}) != len(peers):
        raise ValueError("peer names must be unique")
    return peers


def parse_dns_server(server: str) -> tuple[str, int]:
    """A DNS server's ``IP[:PORT]`` or ``[IPv6]:PORT`` (port 53 by default) as (ip, port);
    ValueError if bad."""
    host, port = server, "53"
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("53" if not rest else "?")
    elif server.count(":") == 1:
        host, _, port = server.partition(":")
    ipaddress.ip_address(host)  # "... does not appear to be an IPv4 or IPv6 address"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r}")
    return host, int(port)
