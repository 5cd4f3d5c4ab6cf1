"""haproxy.cfg for the data plane, from what the control plane knows (pure: text in, text out).

HAProxy answers the public gRPC and REST ports on sockets tfscache bound itself and handed over
(``bind fd@N``), so port 0 works, and the port stays open while HAProxy restarts. A request for
a hot method names its model in the gRPC body or the REST path; the model's name is looked up in
one map, ``routes.map`` (model name -> node name, written through the runtime API), and a hit
goes straight to that node, counted in the stick table ``inflight`` under ``MODEL@NODE``. A
miss, a pinned version or label, a compressed message, or a request HAProxy cannot parse goes
unchanged to tfscache's Python front end (``default_backend``), which stays the slow path.

Why a route can be taken away safely: the configuration runs one thread (``nbthread 1``), which
also answers the runtime API. A request's lookup and its ``track-sc0`` are consecutive rules of
one evaluation with nothing between them that yields, so when ``del map`` returns every request
that found the route is already counted, and every later request misses. The control plane
therefore deletes a route, then waits for ``conn_cur`` of ``MODEL@NODE`` to reach 0, then
unloads (docs/data-plane.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAP = "routes.map"
TABLE = "inflight"
# TF Serving's PredictionService methods whose request's field 1 is a ModelSpec (name = 1,
# version = 2, signature_name = 3, version_label = 4): tensorflow_serving/apis/*.proto.
TFS_METHODS = ("Predict", "Classify", "Regress", "GetModelMetadata")
TFS_REST_VERBS = ("predict", "classify", "regress")
# The part of a gRPC message waited for before its fields are read. protobuf() parses what is
# buffered, so a large message is routed by its first bytes, where encoders put field 1.
BODY_AT_LEAST = "16k"
_SPEC = "req.body,bytes(5),protobuf(1)"  # the gRPC message after its 5-byte prefix; field 1


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
    rest_fd: int
    fallback_grpc: str  # tfscache's Python front end, host:port
    fallback_rest: str
    nodes: Sequence[Node]
    state_dir: Path  # routes.map lives here
    runtime_socket: Path  # the runtime API (mode 0600, level admin)

    @property
    def map_path(self) -> Path:
        return self.state_dir / MAP


def backend(protocol: str, node: str) -> str:
    """The backend that carries ``protocol`` ("grpc" or "rest") to ``node``."""
    return f"{protocol}_{node}"


def render(plan: Plan) -> str:
    """The whole haproxy.cfg for ``plan``."""
    routes = str(plan.map_path)
    methods = " ".join(f"/tensorflow.serving.PredictionService/{m}" for m in TFS_METHODS)
    verbs = "|".join(TFS_REST_VERBS)
    lines = [
        "global",
        "    nbthread 1",
        f"    stats socket {plan.runtime_socket} mode 600 level admin expose-fd listeners",
        "    tune.bufsize 65536",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout http-request 60s",
        "",
        f"backend {TABLE}",
        "    stick-table type string len 512 size 1m expire 1h store conn_cur,http_req_cnt",
        "",
        "frontend grpc",
        f"    bind fd@{plan.grpc_fd} proto h2",
        f"    acl hot path {methods}",
        f"    http-request wait-for-body time 1s at-least {BODY_AT_LEAST} if hot",
        # byte 0 of a gRPC message is its compressed flag; a compressed body cannot be parsed
        "    acl plain req.body,bytes(0,1),hex -m str 00",
        # A version (model_spec.version) or a label pins the request: the slow path. Each level
        # is its own protobuf(): HAProxy 2.6 finds a dotted path's nested field only when it
        # is the first of its message.
        f"    http-request set-var(txn.spec) {_SPEC} if hot",
        "    http-request set-var(txn.version) var(txn.spec),protobuf(2) if hot",
        "    http-request set-var(txn.label) var(txn.spec),protobuf(4) if hot",
        "    acl pinned var(txn.version) -m found",
        "    acl labelled var(txn.label) -m found",
        "    http-request set-var(txn.model) var(txn.spec),protobuf(1) "
        "if hot plain !pinned !labelled",
        *_lookup(routes),
        "    use_backend grpc_%[var(txn.node)] if { var(txn.node) -m found }",
        "    default_backend python_grpc",
        "",
        "frontend rest",
        f"    bind fd@{plan.rest_fd}",
        f"    acl hot path_reg ^/v1/models/[^/:]+:({verbs})$",
        "    http-request set-var(txn.model) path,field(4,/),field(1,:) if METH_POST hot",
        *_lookup(routes),
        "    use_backend rest_%[var(txn.node)] if { var(txn.node) -m found }",
        "    default_backend python_rest",
        "",
        "backend python_grpc",
        f"    server python {plan.fallback_grpc} proto h2",
        "",
        "backend python_rest",
        f"    server python {plan.fallback_rest}",
    ]
    for node in plan.nodes:
        lines += ["", f"backend {backend('grpc', node.name)}",
                  f"    server {node.name} {node.grpc} proto h2",
                  "", f"backend {backend('rest', node.name)}",
                  f"    server {node.name} {node.rest}"]
    return "\n".join(lines) + "\n"


def _lookup(routes: str) -> list[str]:
    """The model -> node lookup and its count, consecutive so nothing runs between them."""
    found = "if { var(txn.model) -m found }"
    routed = "if { var(txn.node) -m found }"
    return [
        f"    http-request set-var(txn.node) var(txn.model),map({routes}) {found}",
        f"    http-request set-var(txn.key) var(txn.model),concat(@,txn.node) {routed}",
        f"    http-request track-sc0 var(txn.key) table {TABLE} {routed}",
    ]
