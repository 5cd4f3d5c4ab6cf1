"""haproxy.cfg for the data plane, from what the control plane knows (pure: text in, text out).

HAProxy answers the public gRPC and REST ports on sockets tfscache bound itself and handed over
(``bind fd@N``), so port 0 works, and the port stays open while HAProxy restarts. A request for
a hot method names its model in the gRPC body or the REST path; the model's name is looked up in
one map, ``routes.map`` (model name -> the nodes that serve it: one node, or a group of copies
such as ``node0+node1``, written through the runtime API). A hit goes straight to one node of
that group: the one with the fewest routed requests in flight (the table ``load``, keyed by
node), the first in the group's order on a tie. It is counted in the stick table ``inflight``
under ``MODEL@NODE``, the node it went to. A miss, a pinned version or label, a compressed
message, or a request HAProxy cannot parse goes unchanged to tfscache's Python front end
(``default_backend``), which stays the slow path.

Sidecar mode (``Plan.mark``): a second map, ``peers.map`` (model name -> a peer sidecar),
is looked up when ``routes.map`` has no route and the request is not marked as forwarded by a
peer already. A hit goes to that peer's public port (its HAProxy or its Python front end), marked
as forwarded (the Python path's mark, ``x-tfscache-forwarded``), so the peer serves it itself and
never forwards it again. A hot request that finds no route at all, and is not marked, is counted
in the table ``missed`` under its model: the control plane learns there which models are asked
for that a peer may own.

Why a route can be taken away safely: the configuration runs one thread (``nbthread 1``), which
also answers the runtime API. A request's lookup, its choice of a node in the group and its
``track-sc0`` are consecutive rules of one evaluation with nothing between them that yields, so
when ``del map`` (or a ``set map`` to a group without that node) returns, every request that
found the old route is already counted under the node it chose, and every later request misses
the node. The control plane therefore takes a node out of a model's route, then waits for
``conn_cur`` of ``MODEL@NODE`` to reach 0, then unloads (docs/data-plane.md).

With [tls], HAProxy terminates TLS on both public ports (``Tls``): the certificate chain and its
key in one PEM, ALPN h2 on the gRPC port and http/1.1 on the REST port (the Python REST front
end speaks HTTP/1.1 only), and with a client CA ``verify required``. The hop to the nodes and to the
Python front end stays plain on 127.0.0.1. In sidecar mode the hop to a peer speaks TLS as the
Python path's does (``_to_peer``): the same certificate as a client certificate, the peer's
checked against the peer CAs for the peer's name (``peer_name``).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAP = "routes.map"
TABLE = "inflight"  # MODEL@NODE -> routed requests in flight (conn_cur) and counted (http_req_cnt)
LOAD = "load"  # NODE -> routed requests in flight there, all models (conn_cur)
PEER_MAP = "peers.map"  # sidecar mode: model name -> the peer sidecar that owns it
MISSED = "missed"  # sidecar mode: MODEL -> hot requests that found no route and no mark
# Joins a group's nodes in a map value. Node ids are words of [A-Za-z0-9_.-] (control.py).
GROUP = "+"
# The part of a gRPC message waited for before its fields are read. protobuf() parses what is
# buffered, so a large message is routed by its first bytes, where encoders put field 1.
BODY_AT_LEAST = "16k"


# The request's id: the client's x-request-id, or a new one; sent on to the node or the Python
# front end, and back on the reply. A reply's headers are what HAProxy can write (not trailers),
# so gRPC clients read it in the initial metadata (the Python front end also sends it in the
# trailing metadata, as without HAProxy).
REQUEST_ID = (
    "    http-request set-var(txn.reqid) req.hdr(x-request-id)"
    " if { req.hdr(x-request-id) -m len 1: }",
    "    http-request set-var(txn.reqid) uuid unless { var(txn.reqid) -m found }",
    "    http-request set-header x-request-id %[var(txn.reqid)]",
    "    http-response set-header x-request-id %[var(txn.reqid)]",
)


@dataclass(frozen=True)
class Rules:
    """How one protocol's hot requests name their model, for HAProxy (the protocol's package
    writes them with ``grpc_rules`` and ``rest_rules``): the gRPC lines set ``txn.name`` and
    the acl ``pinned`` (a version or label named: the slow path), the REST lines ``txn.model``."""

    grpc: tuple[str, ...]
    rest: tuple[str, ...]
    # a routed REST request's method, as the front end names it, by its path's last word
    # (after the last / or :), for the request metrics (requests.py)
    rest_methods: tuple[tuple[str, str], ...] = ()


def field_of(path: tuple[int, ...]) -> str:
    """The sample of a gRPC message's field at ``path`` (field numbers, outermost first).

    Each level is its own protobuf() converter: HAProxy 2.6 finds a dotted path's nested field
    only when it is the first field of its message."""
    return "req.body,bytes(5)," + ",".join(f"protobuf({number})" for number in path)


def grpc_rules(methods: tuple[str, ...], name: tuple[int, ...],
               pins: tuple[tuple[tuple[int, ...], str], ...]) -> tuple[str, ...]:
    """Hot gRPC ``methods`` (paths) name their model at field path ``name``; each of ``pins``
    (a field path, an acl match such as ``-m found``) pins a request to the slow path."""
    lines = [f"    acl hot path {' '.join(methods)}",
             f"    http-request wait-for-body time 1s at-least {BODY_AT_LEAST} if hot",
             f"    http-request set-var(txn.name) {field_of(name)} if hot"]
    for index, (path, match) in enumerate(pins):
        lines += [f"    http-request set-var(txn.pin{index}) {field_of(path)} if hot",
                  f"    acl pinned var(txn.pin{index}) {match}"]
    return tuple(lines)


def rest_rules(path_regex: str, name: str) -> tuple[str, ...]:
    """Hot REST requests: a POST whose path matches ``path_regex``; ``name``: the sample that
    reads the model's name from it (such as ``path,field(4,/)``)."""
    return (f"    acl hot path_reg {path_regex}",
            f"    http-request set-var(txn.model) {name} if METH_POST hot")


@dataclass(frozen=True)
class Tls:
    """[tls] as HAProxy reads it: ``pem``, the certificate chain followed by its private key;
    ``client_ca``, the CAs a client's certificate must be signed by (mutual TLS), None without.
    Sidecar mode, where every peer is reached over TLS (``Plan.peers``): ``pem`` is also the
    client certificate presented to a peer; ``peer_ca``, the CAs that verify a peer's
    certificate (None: the system's); ``peer_name``, the name a peer's certificate must carry
    (None: the host of the peer's address; ``peer_name()``). The files are ones tfscache wrote
    (certs.py), never the user's."""

    pem: Path
    client_ca: Path | None = None
    peer_ca: Path | None = None
    peer_name: str | None = None


@dataclass(frozen=True)
class Node:
    """One model server: its name (the ring's) and its gRPC and REST addresses (host:port)."""

    name: str
    grpc: str
    rest: str


@dataclass(frozen=True)
class Plan:
    """Everything the configuration says; a new Plan means a reload."""

    grpc_fd: int
    rest_fd: int | None  # None: no REST port (server.rest_port < 0)
    fallback_grpc: str  # tfscache's Python front end, host:port
    fallback_rest: str | None
    nodes: Sequence[Node]
    state_dir: Path  # routes.map lives here
    runtime_socket: Path  # the runtime API (mode 0600, level admin)
    rules: Rules  # the node kind's protocol's
    log_socket: Path | None = None  # where routed requests are logged (requests.py)
    # server.max_receive_message_bytes: a larger request takes the slow path, whose limit
    # answers it as without HAProxy (RESOURCE_EXHAUSTED, 413)
    max_body: int = 256 << 20
    # the most nodes a route's group may name (its copies); None: as many as there are nodes.
    # HAProxy's choice has one step per node after the first.
    group_width: int | None = None
    tls: Tls | None = None  # None: plain text on the public ports and to the peers
    # sidecar mode: the other sidecars a model may be routed to (their public addresses); the
    # forwarded mark (header, value: this sidecar's name) on what is sent them, which a request
    # also carries when a peer forwarded it here (None: not a sidecar, no peer routes); and the
    # headers of a peer's reply meant for this sidecar, not the client (its load report); and the
    # header (name, value) that tells the peer HAProxy sent it, so the peer sends no load report
    peers: Sequence[Node] = ()
    mark: tuple[str, str] | None = None
    peer_private: tuple[str, ...] = ()
    via: tuple[str, str] | None = None
    # server.node_connections: False (per-request) gives each request sent to a node or a peer a
    # connection of its own (``max-reuse 0``), True (shared) lets HAProxy keep connections and
    # send many requests on each (``Plan.server_options``, docs/data-plane.md "Nodes that fail")
    shared_connections: bool = False

    @property
    def map_path(self) -> Path:
        return self.state_dir / MAP

    @property
    def peer_map_path(self) -> Path:
        return self.state_dir / PEER_MAP

    def server_options(self, protocol: str) -> str:
        """The options of a node's or a peer's server line for ``protocol`` (grpc, rest).

        Why one request per connection by default: HAProxy 2.6 sends a request again after its
        server connection failed only when that connection was new. A request that fails on a
        connection used before, when it is not the first one on its client's connection (a gRPC
        channel's calls are streams of one), is closed with no reply for the client to send
        again (HTTP/2 RST_STREAM REFUSED_STREAM, which gRPC clients report as UNAVAILABLE and do
        not send again). A node's crash fails every request in flight on it that way. On a new
        connection the failure is retried, and the retry, redispatched, finds the node refusing
        and goes to the backup."""
        return _proto(protocol) + ("" if self.shared_connections else " max-reuse 0")

    @property
    def width(self) -> int:
        nodes = max(1, len(self.nodes))
        return nodes if self.group_width is None else max(1, min(self.group_width, nodes))


# A UNIX socket's path is at most 107 bytes (sun_path), and HAProxy binds the runtime socket
# itself, first as PATH.PID.tmp (then renamed): 90 leaves room for that suffix.
SOCKET_PATH_MAX = 90


def runtime_socket_for(state_dir: Path) -> Path:
    """Where the runtime API listens: ``STATE/dataplane/runtime.sock``, or, when that path is too
    long for a UNIX socket (a deep state directory), ``runtime.sock`` in a directory of its own
    under the system's temporary directory, named by the state directory's hash and made mode
    0700 by the caller (``private_dir``)."""
    path = Path(state_dir) / "runtime.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(Path(state_dir).resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tfscache-haproxy-{digest}" / "runtime.sock"


def private_dir(path: Path) -> None:
    """Make ``path`` a directory only its owner can enter (the runtime socket's, off the state
    directory); refuse one that someone else owns or can enter."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{path} must be a directory of this user with mode 0700")


def group(nodes: Sequence[str]) -> str:
    """A route's map value: its nodes, in the order ties go (the first copy first)."""
    return GROUP.join(nodes)


def members(value: str) -> tuple[str, ...]:
    """The nodes of a route's map value (``group``'s inverse)."""
    return tuple(value.split(GROUP))


def peer_name(tls: Tls, address: str) -> str | None:
    """The name HAProxy checks a peer's certificate for, as the Python path checks it
    (tfscache.tls.PeerTls: grpc and ssl verify ``tls.peer_server_name``, else the host of the
    peer's ``address``). None where HAProxy cannot check it the same way, so the peer is not
    reached through HAProxy at all (its requests take the slow path): an IP address (HAProxy 2.6
    matches a name against the certificate's DNS names and common name only, never an IP
    address in its subjectAltName; with no name it would check no name at all), or anything
    that is not a plain DNS name (a gRPC target such as ``dns:///host:port``)."""
    name = tls.peer_name or _host(address)
    return name if _DNS_NAME.fullmatch(name) else None


def _host(address: str) -> str:
    """``host`` of ``host:port`` (``[v6]:port``: ``v6``)."""
    host = address.rpartition(":")[0] if ":" in address else address
    return host.removeprefix("[").removesuffix("]")


# A DNS name: labels of letters, digits and inner hyphens, the last one not all digits (so no
# IPv4 address in any of its spellings; an IPv6 address has colons).
_DNS_NAME = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                       r"(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?")


def _proto(protocol: str) -> str:
    """A server line's protocol option: HTTP/2 for gRPC, HTTP/1.1 (the default) for REST."""
    return " proto h2" if protocol == "grpc" else ""


def backend(protocol: str, node: str) -> str:
    """The backend that carries ``protocol`` ("grpc" or "rest") to ``node``."""
    return f"{protocol}_{node}"


def render(plan: Plan) -> str:
    """The whole haproxy.cfg for ``plan``."""
    lines = [
        "global",
        "    nbthread 1",
        f"    stats socket {plan.runtime_socket} mode 600 level admin expose-fd listeners",
        "    tune.bufsize 65536",
        # the PEM holds the key: no .key, .ocsp or .issuer is looked for beside it
        *(["    ssl-load-extra-files none"] if plan.tls else []),
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout http-request 60s",
        # A node that refuses a connection is marked down at once (observe layer4), and the
        # request goes again, to the backend's backup: the Python front end, which knows what
        # to do. A request in flight when its node died (no answer yet) is sent again too, if
        # its connection to the node was new (Plan.server_options) and HAProxy held all of it;
        # its first retry may still find the node up, since only a refused connection marks it
        # down: so three retries, each redispatched (the second one reaches the backup).
        # Without them a gRPC client got RST_STREAM REFUSED_STREAM and a REST client 502 or
        # 503 (tests/frontend/test_restarts.py, the node's SIGKILL).
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response junk-response",
        *_logging(plan.log_socket),
        "",
        f"backend {TABLE}",
        "    stick-table type string len 512 size 1m expire 1h store conn_cur,http_req_cnt",
        "",
        f"backend {LOAD}",
        "    stick-table type string len 512 size 10k expire 1h store conn_cur",
        "",
        *_missed(plan),
        "frontend grpc",
        f"    bind fd@{plan.grpc_fd}{_tls(plan.tls, 'h2')} proto h2",
        *REQUEST_ID,
        *plan.rules.grpc,
        # byte 0 of a gRPC message is its compressed flag; a compressed body cannot be parsed
        "    acl plain req.body,bytes(0,1),hex -m str 00",
        "    http-request set-var(txn.model) var(txn.name) if plain !pinned",
        # bytes 1-4: the message's length
        f"    http-request unset-var(txn.model) if {{ req.body,bytes(1,4),hex,hex2i gt {plan.max_body} }}",
        *_lookup(plan),
        # a reply's grpc-status is in its headers only when it has no message (trailers-only,
        # as servers answer an error); otherwise in the trailers, which HAProxy does not read
        "    http-response set-var(txn.grpc) res.hdr(grpc-status)",
        "    use_backend grpc_%[var(txn.node)] if { var(txn.node) -m found }",
        "    default_backend python_grpc",
        "",
        "backend python_grpc",
        f"    server python {plan.fallback_grpc} proto h2",
    ]
    if plan.rest_fd is not None:
        lines += [
            "",
            "frontend rest",
            f"    bind fd@{plan.rest_fd}{_tls(plan.tls, 'http/1.1')}",
            *REQUEST_ID,
            *plan.rules.rest,
            # a body over the limit, or of a length not told up front, takes the slow path
            f"    http-request unset-var(txn.model) if {{ req.hdr_val(content-length) gt {plan.max_body} }}",
            "    http-request unset-var(txn.model) if { req.hdr(transfer-encoding) -m found }",
            *_lookup(plan),
            # HAProxy sends a request again (retry-on) only if it holds all of it: a REST client
            # may send its body after the headers, so a routed one is waited for, as gRPC's is
            f"    http-request wait-for-body time 1s at-least {BODY_AT_LEAST} "
            "if { var(txn.node) -m found }",
            "    use_backend rest_%[var(txn.node)] if { var(txn.node) -m found }",
            "    default_backend python_rest",
            "",
            "backend python_rest",
            f"    server python {plan.fallback_rest}",
        ]
    for node in plan.nodes:
        lines += _node(node, "grpc", node.grpc, plan.fallback_grpc, plan)
        if plan.rest_fd is not None:
            lines += _node(node, "rest", node.rest, plan.fallback_rest, plan)
    for peer in plan.peers:
        lines += _peer(peer, "grpc", peer.grpc, plan)
        if plan.rest_fd is not None:
            lines += _peer(peer, "rest", peer.rest, plan)
    return "\n".join(lines) + "\n"


def _tls(tls: Tls | None, alpn: str) -> str:
    """A public bind's TLS options: none without ``tls``; with ``tls.client_ca``, a client
    without a certificate that one of those CAs signed fails its handshake, as on the Python
    front ends."""
    if tls is None:
        return ""
    options = f" ssl crt {tls.pem} alpn {alpn}"
    if tls.client_ca is not None:
        options += f" ca-file {tls.client_ca} verify required"
    return options


def _node(node: Node, protocol: str, address: str, fallback: str, plan: Plan) -> list[str]:
    """One node's backend: the node, and the Python front end as the backup it falls back to
    once the node refuses a connection (marked down on the first error, up again on its check).
    """
    kept = _proto(protocol)  # the front end's connections are reused
    return ["", f"backend {backend(protocol, node.name)}",
            f"    server {node.name} {address}{plan.server_options(protocol)} check inter 1s "
            "observe layer4 error-limit 1 on-error mark-down",
            f"    server python {fallback}{kept} backup"]


def _peer(peer: Node, protocol: str, address: str, plan: Plan) -> list[str]:
    """A peer sidecar's backend: its public port, each request marked as forwarded by this
    sidecar (so the peer serves it itself and never forwards it again), and the Python front end
    as the backup, as for a node. A request sent once more to the backup after the peer refused
    its connection still carries the mark: this sidecar's front end then serves it from its own
    node, as the peer would have. A peer with no REST port: its REST requests go to the Python
    front end, unmarked (the slow path). The peer's report of its own load (``x-tfscache-load``)
    is for this sidecar's Python path, not the client: each request also says that HAProxy sent
    it (``Plan.via``), so the peer sends none; one that a peer sends all the same (an older
    tfscache) is dropped from a REST reply's headers (``Plan.peer_private``), but not from gRPC
    trailers, which HAProxy cannot edit. With [tls] the peer is reached over TLS (``_to_peer``);
    one whose certificate HAProxy cannot check as the Python path does (``peer_name``) is the
    slow path too."""
    fallback = plan.fallback_grpc if protocol == "grpc" else plan.fallback_rest
    kept = _proto(protocol)
    lines = ["", f"backend {backend(protocol, peer.name)}"]
    secure = _to_peer(plan.tls, address, protocol) if address else None
    if secure is None:
        return lines + [f"    server python {fallback}{kept}"]
    lines += [f"    http-request set-header {plan.mark[0]} {plan.mark[1]}"]
    if plan.via is not None:
        lines += [f"    http-request set-header {plan.via[0]} {plan.via[1]}"]
    if protocol == "rest":
        lines += [f"    http-response del-header {header}" for header in plan.peer_private]
    return lines + [f"    server {peer.name} {address}{plan.server_options(protocol)}{secure} "
                    "check inter 1s observe layer4 error-limit 1 on-error mark-down",
                    f"    server python {fallback}{kept} backup"]


def _to_peer(tls: Tls | None, address: str, protocol: str) -> str | None:
    """A peer's server options for TLS, as the Python path's hop (tfscache.tls.PeerTls): this
    sidecar's certificate as the client certificate, the peer's verified against ``peer_ca``
    (or the system's CAs) for ``peer_name``, sent as SNI too (``verifyhost`` for the health
    checks, which send ``check-sni``), ALPN h2 for gRPC, http/1.1 for REST. Empty without
    [tls]: plain text, as the peers' own ports; None: a peer HAProxy cannot verify so."""
    if tls is None:
        return ""
    name = peer_name(tls, address)
    if name is None:
        return None
    alpn = "h2" if protocol == "grpc" else "http/1.1"
    return (f" ssl crt {tls.pem} ca-file {tls.peer_ca or '@system-ca'} verify required"
            f" verifyhost {name} sni str({name}) check-sni {name} alpn {alpn}")


def _missed(plan: Plan) -> list[str]:
    """Sidecar mode: the table of models asked for without a route (the control plane reads it
    for models a peer may own)."""
    if plan.mark is None:
        return []
    return [f"backend {MISSED}",
            "    stick-table type string len 512 size 100k expire 1h store http_req_cnt", ""]


def _logging(socket: Path | None) -> list[str]:
    """Each routed request's log line, raw, to tfscache's datagram socket (requests.py reads
    ``LOG_FORMAT``); requests HAProxy did not route are the front end's to count, so no line."""
    if socket is None:
        return []
    return [f"    log {socket} len 4096 format raw local0 info",
            f"    log-format \"{LOG_FORMAT}\""]


# One routed request: a marker, its arrival (epoch seconds), the frontend (grpc, rest), the
# server that answered (a node, or "python": the backup, which counts the request itself),
# the HTTP status, the active time in ms, the model, the node, the grpc-status header, the path.
LOG_MARK = "tfscache-routed"
LOG_FORMAT = (f"{LOG_MARK} %Ts.%ms %f %s %ST %Ta %[var(txn.model)] %[var(txn.node)] "
              "%[var(txn.grpc)] %HP")


def _lookup(plan: Plan) -> list[str]:
    """The model -> group lookup, the choice of one node of the group, and its counts, all
    consecutive so nothing runs between them. ``Plan.width``: the most nodes a group can have.
    The choice: the first node, then each next one that has fewer routed requests in flight than
    the best so far (a missing word is the empty string: skipped). In sidecar mode a model with
    no route to a local node may have one to a peer (``peers.map``), unless the request is
    marked as forwarded already: a peer sent it here to be served here."""
    routes, width = str(plan.map_path), plan.width
    found = "if { var(txn.model) -m found }"
    grouped = "if { var(txn.group) -m found }"
    routed = "if { var(txn.node) -m found }"
    lines = [f"    http-request set-var(txn.group) var(txn.model),map({routes}) {found}"]
    if plan.mark is not None:
        lines += [f"    acl forwarded req.hdr({plan.mark[0]}) -m found",
                  f"    http-request set-var(txn.group) var(txn.model),map({plan.peer_map_path}) "
                  "if { var(txn.model) -m found } !{ var(txn.group) -m found } !forwarded"]
    lines += [
        f"    http-request set-var(txn.node) var(txn.group),word(1,{GROUP}) {grouped}",
        f"    http-request set-var(txn.least) var(txn.node),table_conn_cur({LOAD}) {routed}",
    ]
    for index in range(2, width + 1):
        fewer = f"if {{ var(txn.less{index}) -m int lt 0 }}"
        lines += [
            f"    http-request set-var(txn.node{index}) var(txn.group),word({index},{GROUP}) "
            f"{grouped}",
            f"    http-request set-var(txn.load{index}) var(txn.node{index}),"
            f"table_conn_cur({LOAD}) if {{ var(txn.node{index}) -m len gt 0 }}",
            f"    http-request set-var(txn.less{index}) var(txn.load{index}),sub(txn.least) "
            f"if {{ var(txn.load{index}) -m found }}",
            f"    http-request set-var(txn.node) var(txn.node{index}) {fewer}",
            f"    http-request set-var(txn.least) var(txn.load{index}) {fewer}",
        ]
    return lines + [
        f"    http-request set-var(txn.key) var(txn.model),concat(@,txn.node) {routed}",
        f"    http-request track-sc0 var(txn.key) table {TABLE} {routed}",
        f"    http-request track-sc1 var(txn.node) table {LOAD} {routed}",
        "    http-request set-log-level silent unless { var(txn.node) -m found }",
        *([f"    http-request track-sc2 var(txn.model) table {MISSED} "
           "if { var(txn.model) -m found } !{ var(txn.node) -m found } !forwarded"]
          if plan.mark is not None else []),
    ]
