"""The sections of tfscache's settings (``tfscache.settings`` loads and checks them).

Each field is declared with ``setting(default, doc, parse=, check=, flag=)``: its doc is
the help text, ``flag`` the command-line flag (if any), ``parse`` turns a raw value into
the field's type, and ``check`` returns why a value is bad (or None). A new section is a
dataclass here plus one field of ``tfscache.settings.Settings``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from tfscache.cache.policy import AUTO, POLICIES
from tfscache.discovery.peer import parse_dns_server, parse_peers
from tfscache.discovery.table import BACKENDS, DEFAULT_BACKEND, one_of
from tfscache.kinds.table import DEFAULT_KIND, KINDS
from tfscache.units import parse_bytes

MiB = 1 << 20
DATA_PLANES = ("python", "haproxy")
# what tfscache hears of each request HAProxy routes (docs/data-plane.md, "Logged or counted")
ROUTED_REQUESTS = ("logged", "counted")
NODE_CONNECTIONS = ("per-request", "shared")


def setting(default: Any, doc: str, *, parse: Callable[[Any], Any] | None = None,
             check: Callable[[Any], str | None] | None = None, flag: str | None = None) -> Any:
    meta = {"doc": doc, "parse": parse, "check": check, "flag": flag}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _at_least(low: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be >= {low}"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


def _dns_server(v: str) -> str | None:
    try:
        if v:
            parse_dns_server(v)
    except ValueError as exc:
        return f"must be IP[:PORT] or [IPv6]:PORT of a DNS server ({exc})"
    return None


def parse_workers(raw: Any) -> int:
    """``server.workers``: a count >= 1, or "auto" (one per core, at most 8)."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return min(os.cpu_count() or 1, 8)
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).strip().isdigit():
        raise ValueError("must be a whole number >= 1 or auto")
    return int(raw)


def _parent_dir(path: str) -> str | None:
    """Why a file cannot be created at ``path`` (None: it can, or it is empty: not set)."""
    if not path:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(parent) else f"its directory {parent} does not exist"


@dataclass
class CacheSection:
    """Per-node cache (tfscache.cache.manager.CacheManager takes this section): caps, eviction, timing."""

    max_models_per_node: int = setting(0, "most models resident on one node at once (0 = no cap)",
                                        check=_at_least(0), flag="--max-models-per-node")
    memory_per_node: int = setting(0, "most bytes of models on one node, e.g. 4GiB (0 = no cap)",
                                    parse=parse_bytes, flag="--memory-per-node")
    policy: str = setting(
        AUTO,
        "eviction policy, by name (tfscache.cache.policy): lru, fifo, lfu, cost, oldest, gdsf, "
        "or auto (gdsf with a memory cap, else lru)",
        check=lambda v: (
            None
            if v in POLICIES or v == AUTO
            else f"must be one of {', '.join(sorted([*POLICIES, AUTO]))}"
        ),
    )
    policy_window_s: float = setting(
        60.0,
        "policy oldest: the window its request counts cover (a model idle " "this long is cold)",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    policy_halflife_requests: float = setting(
        2000.0,
        "policy gdsf: requests to a node after which an earlier "
        "request counts half in a model's frequency",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    gpu_memory_per_node: int = setting(
        0,
        "most GPU bytes of models on one node, measured with NVML, e.g. 20GiB "
        "(0 = no cap; off without a GPU; docs/gpu.md)",
        parse=parse_bytes,
        flag="--gpu-memory-per-node",
    )
    demote: str = setting(
        "none",
        "what a GPU victim does: none (it is unloaded) or host (it moves to host memory and "
        "keeps answering, where the kind can: docs/tiers.md)",
        check=lambda v: None if v in ("none", "host") else "must be one of host, none",
    )
    promote_horizon_s: float = setting(
        60.0,
        "demote host: a demoted model goes back to the GPU when the service time its requests "
        "would save there over this many seconds, at its present rate, pays its promotion "
        "(docs/tiers.md)",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    promote_queue: int = setting(
        4,
        "demote host: a demoted model goes back to the GPU at once when this many of its "
        "requests are in flight together (docs/tiers.md)",
        check=_at_least(1),
    )
    demote_cpu_instances: int = setting(
        1,
        "demote host: the count of CPU instances a model demoted in place runs on "
        "(docs/tiers.md)",
        check=_at_least(1),
    )
    load_timeout_s: float = setting(
        600.0,
        "longest a request without a deadline waits for its model to load",
        check=_at_least(0.001),
    )
    room_timeout_s: float = setting(30.0, "how long a load waits for busy models to go idle before "
                                     "RESOURCE_EXHAUSTED", check=_at_least(0))
    failure_backoff_s: float = setting(
        30.0, "after a failed load, how long requests get the same error", check=_at_least(0)
    )
    free_wait_s: float = setting(
        10.0,
        "under a memory or GPU cap, how long an unloaded model's bytes count "
        "until the node's measured memory drops; then they count as free",
        check=_at_least(0),
    )
    rpc_deadline_s: float = setting(
        10.0, "deadline of GetModelStatus and of reloads that load nothing", check=_at_least(0.001)
    )
    reload_deadline_s: float = setting(300.0, "deadline of a reload that loads models",
                                        check=_at_least(0.001))
    estimate_factor: float = setting(
        1.2, "a model's memory before its first load: this x its size on disk", check=_at_least(0)
    )
    health_retry_s: float = setting(
        5.0,
        "while a node is unhealthy, the longest wait between tries to reach it",
        check=_at_least(0.001),
    )
    prefetch: bool = setting(
        False,
        "co-access prefetch: a likely follower B of a requested model A is loaded "
        "beside A's load, or in the background with idle room, and kept as warm as A "
        "(docs/prefetch.md; off by default: it costs loads where models do not follow "
        "each other in pipelines)",
    )
    prefetch_window_s: float = setting(
        0.25,
        "prefetch: B follows A when requested within this many seconds " "after A was answered",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    prefetch_confidence: float = setting(
        0.2,
        "prefetch: B is loaded with A when at least this share of A's "
        "recent requests were followed by B (decayed counts)",
        check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
    )
    prefetch_min_support: float = setting(
        1.5,
        "prefetch: the fewest decayed A-then-B pairs (each counts 1 when "
        "new; 1.5: two recent ones) before B is loaded with A",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    prefetch_halflife_requests: float = setting(
        50.0,
        "prefetch: requests of A after which an A-then-B pair " "counts half",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    prefetch_followers: int = setting(
        1, "prefetch: most followers of one request loaded", check=_at_least(1)
    )
    prefetch_max_models: int = setting(
        50000,
        "prefetch: most models whose followers are remembered per node "
        "(bounds memory; the least recently requested forgotten first)",
        check=_at_least(1),
    )


@dataclass
class RingSection:
    """Consistent-hash ring of nodes (embedded) or sidecars (peers)."""

    replicas_per_model: int = setting(1, "distinct nodes that may serve each model",
                                       check=_at_least(1), flag="--replicas-per-model")
    vnodes: int = setting(160, "points per node on the hash ring", check=_at_least(1))
    self_name: str = setting(
        "", "sidecar mode: this sidecar's name in the peer list", flag="--name"
    )
    peers: list = setting([], "sidecar mode: every sidecar as {name, grpc, rest} (static list)",
                           parse=parse_peers)


@dataclass
class CopiesSection:
    """Copies that follow load: extra copies of a busy model on the next ring nodes (docs/copies.md)."""

    enabled: bool = setting(
        True,
        "give a busy model extra copies (ring.replicas_per_model is the minimum)",
        flag="--no-copies",
    )
    max_copies: int = setting(
        4, "most copies of one model (0: every node on the ring)", check=_at_least(0)
    )
    signal: str = setting(
        "rate",
        "what a node's load is: rate (requests over rate_window_s, decayed) or "
        "inflight (requests in flight)",
        check=lambda v: None if v in ("rate", "inflight") else "must be rate or inflight",
    )
    balance: float = setting(
        0.1,
        "a node takes a request while its load is under (1 + balance) x the mean "
        "over the ring's nodes",
        check=_at_least(0),
    )
    min_load: float = setting(
        10.0,
        "a node with less load than this is never over its bound (requests per "
        "rate window, or in flight)",
        check=_at_least(0),
    )
    rate_window_s: float = setting(
        10.0, "rate signal: the time constant of the decayed request counts", check=_at_least(0.001)
    )
    hot_share: float = setting(
        0.5,
        "rate signal: a model gains a copy only while its rate per copy is at least "
        "this share of a mean node's",
        check=_at_least(0),
    )
    hot_inflight: float = setting(
        2.0,
        "inflight signal: a model gains a copy only with at least this many of its "
        "requests in flight per copy",
        check=_at_least(0),
    )
    cool_s: float = setting(
        600.0,
        "an extra copy that got no request for this long is dropped (and its "
        "node's cache unloads it once idle)",
        check=_at_least(0),
    )
    sweep_s: float = setting(
        5.0, "how often extra copies are checked for cooling down", check=_at_least(0.01)
    )
    peer_reports: bool = setting(
        True,
        "sidecar mode: take the load a peer reports of its own node on the answer "
        "to a request forwarded to it (x-tfscache-load) as that node's load",
    )


@dataclass
class NodeSection:
    """The model-server nodes behind the front end."""

    backend: str = setting(
        DEFAULT_KIND,
        "the kind of node, by name (tfscache.kinds.table): "
        + "; ".join(f"{name}: {kind.summary}" for name, kind in KINDS.items()),
        flag="--backend",
        check=lambda v: None if v in KINDS else f"must be one of {', '.join(KINDS)}",
    )
    local_nodes: int = setting(1, "embedded mode: how many `tfscache node` children to run",
                                check=_at_least(0), flag="--local-nodes")
    local_host_nodes: int = setting(
        0,
        "embedded mode: how many more node children to run as the host tier, the GPU hidden "
        "from them (CUDA_VISIBLE_DEVICES=''), off the ring: with cache.demote = host, victims of "
        "the other nodes move there and keep answering (docs/tiers.md)",
        check=_at_least(0), flag="--local-host-nodes")
    node_command: str = setting(
        "",
        "run this model server (e.g. tensorflow_model_server) instead of " "`tfscache node`",
        flag="--node-command",
    )
    node_address: str = setting("", "sidecar mode: the one node, as HOST:GRPC_PORT[,REST_PORT]",
                                 flag="--node-address")
    node_tier: str = setting(
        "gpu",
        "sidecar mode: this sidecar's node's tier, announced through discovery: gpu (on the "
        "ring) or host (off the ring: it holds what the gpu sidecars demote; docs/tiers.md)",
        check=lambda v: None if v in ("gpu", "host") else "must be one of gpu, host",
        flag="--node-tier")
    file_system_poll_wait_seconds: float = setting(0.1, "node's --file_system_poll_wait_seconds "
                                                    "(tensorflow_model_server needs >= 1)",
                                                    check=_at_least(0.001))
    num_load_threads: int = setting(
        2, "node's --num_load_threads (>= 2: one stuck load blocks no other)", check=_at_least(2)
    )
    max_num_load_retries: int = setting(0, "node's --max_num_load_retries", check=_at_least(0))
    extra_args: list = setting([], "more flags for each node process, as a list of strings")
    fork_nodes: bool = setting(
        True,
        "embedded `tfscache node` children are forked from one process that "
        "imported TensorFlow once (a start or restart serves in ~0.1 s; the nodes share "
        "its memory pages); false: each child imports it in a fresh interpreter",
    )
    template_socket: str = setting(
        "",
        "fork the `tfscache node` children from this node template, already running "
        "(`python -m tfscache.modelserver.template SOCKET`, shared by several instances on one "
        "host); empty, or a template that does not answer: this instance starts its own",
    )
    start_timeout_s: float = setting(120.0, "longest wait for a node to start serving",
                                      check=_at_least(0.1))
    state_dir: str = setting(
        "",
        "where node config and cache state files go (default: a persistent "
        "per-instance directory, $XDG_STATE_HOME/tfscache/<instance>; see docs)",
    )


@dataclass
class ServerSection:
    """The front end's own listeners."""

    bind_address: str = setting("0.0.0.0", "address the gRPC and REST front ends bind",
                                 flag="--bind-address")
    grpc_port: int = setting(
        8500, "gRPC port (0 = pick a free one)", check=_port, flag="--grpc-port"
    )
    rest_port: int = setting(8501, "REST port (0 = pick a free one, -1 = off)",
                              check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
                              flag="--rest-port")
    max_receive_message_bytes: int = setting(256 * MiB, "largest request accepted, both transports",
                                              parse=parse_bytes, flag="--max-receive-message-size")
    max_send_message_bytes: int = setting(256 * MiB, "largest response sent", parse=parse_bytes,
                                           flag="--max-send-message-size")
    rest_timeout_s: float = setting(60.0, "deadline of a REST request forwarded to a node",
                                     check=_at_least(0.001))
    refusal_log_period_s: float = setting(
        10.0,
        "the REST front end counts requests that do not parse as HTTP "
        "(414/431/400) in one WARNING line per this period at most",
        check=_at_least(0),
    )
    ports_file: str = setting("", "write {\"grpc\": N, \"rest\": M, \"pid\": P} here once serving",
                               flag="--ports-file")
    grace_s: float = setting(5.0, "on SIGTERM, how long in-flight requests may finish",
                              check=_at_least(0))
    admin_port: int = setting(
        -1,
        "admin API port (tfscache models/pin/evict/drain; 0 = pick a free one, " "-1 = off)",
        check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
        flag="--admin-port",
    )
    admin_bind_address: str = setting(
        "127.0.0.1", "address the admin API binds (any but loopback needs " "server.admin_token)"
    )
    admin_token: str = setting(
        "", "admin API token, sent by clients as 'authorization: Bearer TOKEN'"
    )
    metrics_port: int = setting(-1, "port of /metrics (Prometheus) and /status (tfscache status), "
                                 "e.g. 8503 (0 = pick a free one, -1 = off)",
                                 check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
                                 flag="--metrics-port")
    metrics_per_model: bool = setting(False, "label per-model cache metrics with the model's name "
                                       "(one series per model: off for many models)")
    request_log: str = setting(
        "",
        "append one row per request served by a local node to this file, the log "
        "`tfscache simulate` replays (CSV; .jsonl: JSON lines; docs/metrics.md)",
        check=_parent_dir,
        flag="--request-log",
    )
    workers: int = setting(
        1,
        "front-end worker processes sharing the gRPC and REST ports (auto = one per core, "
        "at most 8; 1 = one process, no workers: docs/workers.md)",
        parse=parse_workers,
        check=_at_least(1),
        flag="--workers",
    )
    data_plane: str = setting(
        "python",
        "who answers the public ports: python (the front end) or haproxy (warm TF Serving "
        "requests routed natively, the front end behind it: docs/data-plane.md)",
        check=lambda v: None if v in DATA_PLANES else f"must be {one_of(DATA_PLANES)}",
        flag="--data-plane",
    )
    haproxy_binary: str = setting("haproxy", "the haproxy binary the haproxy data plane runs")
    routed_requests: str = setting(
        "logged",
        "haproxy data plane: logged (HAProxy logs each routed request to tfscache: request "
        "metrics by method and code, the request log, the prefetch's learning) or counted (its "
        "stick table's counts only: a fifth of the Python CPU per request; docs/data-plane.md)",
        check=lambda v: None if v in ROUTED_REQUESTS else f"must be {one_of(ROUTED_REQUESTS)}",
        flag="--routed-requests",
    )
    node_connections: str = setting(
        "per-request",
        "haproxy data plane: per-request (each routed request gets a connection of its own to "
        "its node or peer: a node's crash fails no request) or shared (HAProxy keeps them and "
        "sends many requests on each: faster, but a node's crash fails the requests in flight on "
        "it with UNAVAILABLE or 502; docs/data-plane.md)",
        check=lambda v: None if v in NODE_CONNECTIONS else f"must be {one_of(NODE_CONNECTIONS)}",
        flag="--node-connections",
    )


@dataclass
class DiscoverySection:
    """Sidecar mode: how sidecars find each other (tfscache.discovery, docs/discovery.md)."""

    backend: str = setting(
        DEFAULT_BACKEND,
        one_of(row.summary for row in BACKENDS.values()),
        check=lambda v: None if v in BACKENDS else f"must be {one_of(BACKENDS)}",
        flag="--discovery",
    )
    service_name: str = setting("tfscache", "Consul service name / middle segment of etcd keys",
                                 check=lambda v: None if re.fullmatch(r"[A-Za-z0-9_-]+", v)
                                 else "letters, digits, - and _ only")
    advertise_host: str = setting(
        "",
        "host other sidecars reach this one at (default: bind address, "
        "or this host's FQDN when that is 0.0.0.0)",
        flag="--advertise-host",
    )
    ttl_s: float = setting(
        10.0,
        "registration TTL (Consul TTL check, etcd lease), kept alive every TTL/3",
        check=_at_least(1),
    )
    retry_max_s: float = setting(
        5.0,
        "longest back-off between retries while the registry is unreachable",
        check=_at_least(0.1),
    )
    start_timeout_s: float = setting(
        30.0,
        "longest wait at start-up for the first membership and registration",
        check=_at_least(0.1),
    )
    request_timeout_s: float = setting(
        5.0,
        "deadline of each registry call (blocking queries add their wait)",
        check=_at_least(0.1),
    )
    consul_address: str = setting("http://127.0.0.1:8500", "the local Consul agent's HTTP API")
    consul_token: str = setting("", "Consul ACL token, sent as X-Consul-Token")
    consul_wait_s: float = setting(30.0, "Consul blocking-query wait", check=_at_least(1))
    consul_deregister_critical_after_s: float = setting(
        600.0, "Consul's DeregisterCriticalServiceAfter", check=_at_least(60)
    )
    etcd_endpoints: list = setting(["http://127.0.0.1:2379"], "etcd client URLs, one per member")
    etcd_prefix: str = setting("/tfscache", "etcd key prefix: keys are PREFIX/SERVICE/NAME")
    dns_name: str = setting(
        "",
        "dns: the name to resolve, e.g. the headless Service "
        "tfscache-headless.NAMESPACE.svc.cluster.local (required with dns)",
        flag="--dns-name",
    )
    dns_record: str = setting(
        "srv",
        "dns: srv (_grpc._tcp.NAME and _rest._tcp.NAME; peers named by the SRV "
        "target's first label, the pod name) or a (A/AAAA of NAME; peers named by IP)",
        check=lambda v: None if v in ("srv", "a") else "must be srv or a",
    )
    # (not *_port: settings named so are this process's listening ports, tests/deploy checks them)
    dns_port_grpc: int = setting(8500, "dns, record a: the peers' gRPC port", check=_port)
    dns_port_rest: int = setting(
        8501, "dns, record a: the peers' REST port (0 = none)", check=_port
    )
    dns_interval_s: float = setting(5.0, "dns: how often the records are resolved again",
                                     check=_at_least(0.05))
    dns_server: str = setting(
        "",
        "dns: a DNS server IP[:PORT] to ask instead of the system's resolver " "(/etc/resolv.conf)",
        check=_dns_server,
    )
    join: bool = setting(
        True,
        "register with discovery at start-up; false: start serving but stay out of "
        "the ring until `tfscache join` (consul, etcd; static ignores it)",
        flag="--no-join",
    )


@dataclass
class ScaleSection:
    """The scaling signal: tfscache_unloads_per_minute and tfscache_scale_advice
    (tfscache.observe.scale, docs/scaling.md)."""

    window_s: float = setting(
        300.0, "the sliding window capacity unloads per minute are counted over", check=_at_least(1)
    )
    unloads_per_minute_high: float = setting(
        10.0,
        "advise more nodes (+1) when a node's mean capacity unloads " "per minute reach this",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    unloads_per_minute_low: float = setting(
        1.0,
        "advise fewer nodes (-1) only at or below this rate (and when "
        "the resident set fits on one node fewer)",
        check=_at_least(0),
    )
    headroom: float = setting(
        0.2,
        "fewer nodes only if the resident set fits under (1 - headroom) x the "
        "caps of one node fewer",
        check=lambda v: None if 0 <= v < 1 else "must be 0 <= x < 1",
    )


@dataclass
class StorageSection:
    """Model repositories in object stores (s3://, gs://, az://): the local disk tier nodes load from
    (tfscache.storage, docs/storage.md). Unused with a local --model-repository."""

    cache_dir: str = setting(
        "",
        "the disk tier's directory (default: disk-tier/ in node.state_dir); in sidecar "
        "mode one the node can read, e.g. an emptyDir shared in the pod; /dev/shm/... "
        "makes it a memory tier",
        flag="--disk-cache-dir",
    )
    cache_bytes: int = setting(
        10 << 30,
        "most bytes of model versions the disk tier keeps, e.g. 20GiB",
        parse=parse_bytes,
        check=_at_least(1),
        flag="--disk-cache-bytes",
    )
    parallel_downloads: int = setting(8, "objects downloaded at once (all downloads together)",
                                       check=_at_least(1))
    list_interval_s: float = setting(
        1.0,
        "how old a model's listing of the bucket may get: models asked for "
        "within list_active_s are re-listed in the background before that, so a new "
        "version shows within this; 0: every request lists",
        check=_at_least(0),
    )
    list_rate: float = setting(
        20.0,
        "most background LISTs a second, all models together (the stalest first)",
        check=lambda v: None if v > 0 else "must be > 0",
    )
    list_active_s: float = setting(
        600.0,
        "a model asked for within this is kept listed in the background; an idle "
        "one is listed again only once asked for (its old listing answers meanwhile)",
        check=_at_least(0),
    )


def _readable_file(path: str) -> str | None:
    """Why ``path`` cannot be read as a file (None: it can, or it is empty: not set)."""
    if not path:
        return None
    try:
        with open(path, "rb"):
            return None
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"


@dataclass
class TlsSection:
    """TLS on the gRPC and REST front ends, and from a sidecar to its peers (tfscache.tls, docs/tls.md).
    Files are PEM; SIGHUP re-reads them without closing the listeners."""

    cert_file: str = setting(
        "",
        "the front ends' certificate chain (empty: no TLS)",
        check=_readable_file,
        flag="--tls-cert",
    )
    key_file: str = setting(
        "", "the private key of cert_file", check=_readable_file, flag="--tls-key"
    )
    client_ca_file: str = setting(
        "",
        "CA certificates that sign client certificates; set: mutual TLS, a client "
        "without a certificate it signed is refused",
        check=_readable_file,
        flag="--tls-client-ca",
    )
    peer_ca_file: str = setting(
        "",
        "sidecar mode: CA certificates that verify the peers' certificates (default: "
        "client_ca_file if set, else the system's roots)",
        check=_readable_file,
    )
    peer_server_name: str = setting(
        "",
        "sidecar mode: the name the peers' certificates must carry (default: "
        "the host of each peer's address)",
    )
