"""One settings object for ``tfscache serve``: TOML file, TFSCACHE_* environment, CLI flags.

Precedence, lowest first: field defaults, the TOML file (``--config``), environment
variables, command-line flags. Sections nest: ``[cache]`` in TOML is
``TFSCACHE_CACHE_<FIELD>`` in the environment; top-level fields are
``TFSCACHE_<FIELD>``. A bad value raises ``SettingsError`` naming the field and the
value, and start-up stops there.

    model_repository = "/models"
    [cache]
    max_models_per_node = 20
    memory_per_node = "4GiB"
    [ring]
    replicas_per_model = 2
    self_name = "a"                    # sidecar mode: this sidecar's name among the peers
    peers = [{name = "a", grpc = "10.0.0.1:8500", rest = "10.0.0.1:8501"}, ...]
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from tfscache.cache.policy import POLICIES

from tfscache.discovery.peer import parse_peers
from tfscache.units import parse_bytes

MiB = 1 << 20


class SettingsError(ValueError):
    """A setting with a bad value; the message names the field and the value."""


def _setting(default: Any, doc: str, *, parse: Callable[[Any], Any] | None = None,
             check: Callable[[Any], str | None] | None = None, flag: str | None = None) -> Any:
    meta = {"doc": doc, "parse": parse, "check": check, "flag": flag}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _at_least(low: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be >= {low}"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


@dataclass
class CacheSection:
    """Per-node cache (tfscache.cache.manager.CacheManager takes this section): caps, eviction, timing."""

    max_models_per_node: int = _setting(0, "most models resident on one node at once (0 = no cap)",
                                        check=_at_least(0), flag="--max-models-per-node")
    memory_per_node: int = _setting(0, "most bytes of models on one node, e.g. 4GiB (0 = no cap)",
                                    parse=parse_bytes, flag="--memory-per-node")
    policy: str = _setting("lru", "eviction policy, by name (tfscache.cache.policy): lru, fifo, lfu, cost or oldest",
                           check=lambda v: None if v in POLICIES else f"must be one of {', '.join(sorted(POLICIES))}")
    policy_window_s: float = _setting(60.0, "policy oldest: the window its request counts cover (a model idle "
                                      "this long is cold)", check=lambda v: None if v > 0 else "must be > 0")
    gpu_memory_per_node: int = _setting(0, "most GPU bytes of models on one node, measured with NVML, e.g. 20GiB "
                                        "(0 = no cap; off without a GPU; docs/gpu.md)",
                                        parse=parse_bytes, flag="--gpu-memory-per-node")
    load_timeout_s: float = _setting(600.0, "longest a request without a deadline waits for its model to load",
                                     check=_at_least(0.001))
    room_timeout_s: float = _setting(30.0, "how long a load waits for busy models to go idle before "
                                     "RESOURCE_EXHAUSTED", check=_at_least(0))
    failure_backoff_s: float = _setting(30.0, "after a failed load, how long requests get the same error",
                                        check=_at_least(0))
    rpc_deadline_s: float = _setting(10.0, "deadline of GetModelStatus and of reloads that load nothing",
                                     check=_at_least(0.001))
    reload_deadline_s: float = _setting(300.0, "deadline of a reload that loads models",
                                        check=_at_least(0.001))
    estimate_factor: float = _setting(1.2, "a model's memory before its first load: this x its size on disk",
                                      check=_at_least(0))
    health_retry_s: float = _setting(5.0, "while a node is unhealthy, the longest wait between tries to reach it",
                                     check=_at_least(0.001))


@dataclass
class RingSection:
    """Consistent-hash ring of nodes (embedded) or sidecars (peers)."""

    replicas_per_model: int = _setting(1, "distinct nodes that may serve each model",
                                       check=_at_least(1), flag="--replicas-per-model")
    vnodes: int = _setting(160, "points per node on the hash ring", check=_at_least(1))
    self_name: str = _setting("", "sidecar mode: this sidecar's name in the peer list", flag="--name")
    peers: list = _setting([], "sidecar mode: every sidecar as {name, grpc, rest} (static list)",
                           parse=parse_peers)


@dataclass
class NodeSection:
    """The model-server nodes behind the front end."""

    backend: str = _setting("tfserving", "the kind of node: tfserving (TF Serving's API) or triton (NVIDIA "
                            "Triton, Open Inference Protocol)", flag="--backend",
                            check=lambda v: None if v in ("tfserving", "triton") else "must be tfserving or triton")
    local_nodes: int = _setting(1, "embedded mode: how many `tfscache node` children to run",
                                check=_at_least(0), flag="--local-nodes")
    node_command: str = _setting("", "run this model server (e.g. tensorflow_model_server) instead of "
                                 "`tfscache node`", flag="--node-command")
    node_address: str = _setting("", "sidecar mode: the one node, as HOST:GRPC_PORT[,REST_PORT]",
                                 flag="--node-address")
    file_system_poll_wait_seconds: float = _setting(0.1, "node's --file_system_poll_wait_seconds "
                                                    "(tensorflow_model_server needs >= 1)",
                                                    check=_at_least(0.001))
    num_load_threads: int = _setting(2, "node's --num_load_threads (>= 2: one stuck load blocks no other)",
                                     check=_at_least(2))
    max_num_load_retries: int = _setting(0, "node's --max_num_load_retries", check=_at_least(0))
    extra_args: list = _setting([], "more flags for each node process, as a list of strings")
    start_timeout_s: float = _setting(120.0, "longest wait for a node to start serving",
                                      check=_at_least(0.1))
    state_dir: str = _setting("", "where node config and cache state files go (default: a persistent "
                              "per-instance directory, $XDG_STATE_HOME/tfscache/<instance>; see docs)")


@dataclass
class ServerSection:
    """The front end's own listeners."""

    bind_address: str = _setting("0.0.0.0", "address the gRPC and REST front ends bind",
                                 flag="--bind-address")
    grpc_port: int = _setting(8500, "gRPC port (0 = pick a free one)", check=_port, flag="--grpc-port")
    rest_port: int = _setting(8501, "REST port (0 = pick a free one, -1 = off)",
                              check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
                              flag="--rest-port")
    max_receive_message_bytes: int = _setting(256 * MiB, "largest request accepted, both transports",
                                              parse=parse_bytes, flag="--max-receive-message-size")
    max_send_message_bytes: int = _setting(256 * MiB, "largest response sent", parse=parse_bytes,
                                           flag="--max-send-message-size")
    rest_timeout_s: float = _setting(60.0, "deadline of a REST request forwarded to a node",
                                     check=_at_least(0.001))
    ports_file: str = _setting("", "write {\"grpc\": N, \"rest\": M, \"pid\": P} here once serving",
                               flag="--ports-file")
    grace_s: float = _setting(5.0, "on SIGTERM, how long in-flight requests may finish",
                              check=_at_least(0))
    admin_port: int = _setting(-1, "admin API port (tfscache models/pin/evict/drain; 0 = pick a free one, "
                               "-1 = off)", check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
                               flag="--admin-port")
    admin_bind_address: str = _setting("127.0.0.1", "address the admin API binds (any but loopback needs "
                                       "server.admin_token)")
    admin_token: str = _setting("", "admin API token, sent by clients as 'authorization: Bearer TOKEN'")
    metrics_port: int = _setting(-1, "port of /metrics (Prometheus) and /status (tfscache status), "
                                 "e.g. 8503 (0 = pick a free one, -1 = off)",
                                 check=lambda v: None if -1 <= v <= 65535 else "must be -1..65535",
                                 flag="--metrics-port")
    metrics_per_model: bool = _setting(False, "label per-model cache metrics with the model's name "
                                       "(one series per model: off for many models)")


@dataclass
class DiscoverySection:
    """Sidecar mode: how sidecars find each other (tfscache.discovery, docs/discovery.md)."""

    backend: str = _setting("static", "static (ring.peers, re-read on SIGHUP), consul or etcd",
                            check=lambda v: None if v in ("static", "consul", "etcd")
                            else "must be static, consul or etcd", flag="--discovery")
    service_name: str = _setting("tfscache", "Consul service name / middle segment of etcd keys",
                                 check=lambda v: None if re.fullmatch(r"[A-Za-z0-9_-]+", v)
                                 else "letters, digits, - and _ only")
    advertise_host: str = _setting("", "host other sidecars reach this one at (default: bind address, "
                                   "or this host's FQDN when that is 0.0.0.0)", flag="--advertise-host")
    ttl_s: float = _setting(10.0, "registration TTL (Consul TTL check, etcd lease), kept alive every TTL/3",
                            check=_at_least(1))
    retry_max_s: float = _setting(5.0, "longest back-off between retries while the registry is unreachable",
                                  check=_at_least(0.1))
    start_timeout_s: float = _setting(30.0, "longest wait at start-up for the first membership and registration",
                                      check=_at_least(0.1))
    request_timeout_s: float = _setting(5.0, "deadline of each registry call (blocking queries add their wait)",
                                        check=_at_least(0.1))
    consul_address: str = _setting("http://127.0.0.1:8500", "the local Consul agent's HTTP API")
    consul_token: str = _setting("", "Consul ACL token, sent as X-Consul-Token")
    consul_wait_s: float = _setting(30.0, "Consul blocking-query wait", check=_at_least(1))
    consul_deregister_critical_after_s: float = _setting(600.0, "Consul's DeregisterCriticalServiceAfter",
                                                         check=_at_least(60))
    etcd_endpoints: list = _setting(["http://127.0.0.1:2379"], "etcd client URLs, one per member")
    etcd_prefix: str = _setting("/tfscache", "etcd key prefix: keys are PREFIX/SERVICE/NAME")
    join: bool = _setting(True, "register with discovery at start-up; false: start serving but stay out of "
                          "the ring until `tfscache join` (consul, etcd; static ignores it)", flag="--no-join")


@dataclass
class ScaleSection:
    """The scaling signal: tfscache_unloads_per_minute and tfscache_scale_advice (tfscache.scale, docs/scaling.md)."""

    window_s: float = _setting(300.0, "the sliding window capacity unloads per minute are counted over",
                               check=_at_least(1))
    unloads_per_minute_high: float = _setting(10.0, "advise more nodes (+1) when a node's mean capacity unloads "
                                              "per minute reach this", check=lambda v: None if v > 0 else "must be > 0")
    unloads_per_minute_low: float = _setting(1.0, "advise fewer nodes (-1) only at or below this rate (and when "
                                             "the resident set fits on one node fewer)", check=_at_least(0))
    headroom: float = _setting(0.2, "fewer nodes only if the resident set fits under (1 - headroom) x the "
                               "caps of one node fewer", check=lambda v: None if 0 <= v < 1 else "must be 0 <= x < 1")


@dataclass
class Settings:
    """Everything `tfscache serve` reads."""

    model_repository: str = _setting("", "directory holding NAME/VERSION/saved_model.pb",
                                     flag="--model-repository")
    cache: CacheSection = field(default_factory=CacheSection)
    ring: RingSection = field(default_factory=RingSection)
    node: NodeSection = field(default_factory=NodeSection)
    server: ServerSection = field(default_factory=ServerSection)
    log_json: bool = _setting(False, "log JSON objects, one per line, instead of text (--log-json)")
    discovery: DiscoverySection = field(default_factory=DiscoverySection)
    scale: ScaleSection = field(default_factory=ScaleSection)

    @property
    def sidecar(self) -> bool:
        """One node given by address rather than local children."""
        return bool(self.node.node_address)


_SECTIONS = ("cache", "ring", "node", "server", "discovery", "scale")


def iter_fields(settings: Settings | None = None):
    """(dotted name, dataclasses.Field, section class) for every leaf setting."""
    for f in fields(Settings):
        if f.name in _SECTIONS:
            for sub in fields(f.type if isinstance(f.type, type) else globals()[f.type]):
                yield f"{f.name}.{sub.name}", sub
        else:
            yield f.name, f


def _coerce(dotted: str, f: dataclasses.Field, raw: Any) -> Any:
    kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str,
                                                      "list": list, "bool": bool}[f.type]
    try:
        if f.metadata.get("parse"):
            value = f.metadata["parse"](raw)
        elif kind is bool:
            value = raw if isinstance(raw, bool) else {"1": True, "true": True, "0": False,
                                                       "false": False}[str(raw).lower()]
        elif kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(raw)
        elif kind is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
        elif kind is list:
            value = raw.split() if isinstance(raw, str) else list(raw)
        else:
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError
            value = str(raw)
        problem = f.metadata.get("check") and f.metadata["check"](value)
    except (ValueError, TypeError, KeyError) as exc:
        # A parse function's ValueError says what it expected; a builtin's does not read well.
        own = f.metadata.get("parse") and isinstance(exc, ValueError) and str(exc)
        problem = str(exc) if own else f"expected {kind.__name__}"
    if problem:
        raise SettingsError(f"bad value for setting {dotted}: {raw!r} ({problem})")
    return value


def _set(settings: Settings, dotted: str, value: Any) -> None:
    *section, name = dotted.split(".")
    target = getattr(settings, section[0]) if section else settings
    setattr(target, name, value)


def load(config_file: str | Path | None = None, env: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Settings:
    """Defaults < TOML file < TFSCACHE_* environment < overrides (CLI), validated."""
    env = os.environ if env is None else env
    settings = Settings()
    known = dict(iter_fields())
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"cannot read config file {str(config_file)!r}: {exc}") from exc
        for dotted, raw in _flatten(data):
            if dotted not in known:
                raise SettingsError(f"unknown setting {dotted} in {config_file}")
            _set(settings, dotted, _coerce(dotted, known[dotted], raw))
    for dotted, f in known.items():
        key = "TFSCACHE_" + dotted.replace(".", "_").upper()
        if key in env:
            _set(settings, dotted, _coerce(dotted, f, env[key]))
    for dotted, raw in (overrides or {}).items():
        if raw is not None:
            _set(settings, dotted, _coerce(dotted, known[dotted], raw))
    _check_whole(settings)
    return settings


def _flatten(data: Mapping[str, Any]):
    for key, value in data.items():
        if key in _SECTIONS and isinstance(value, Mapping):
            for sub, raw in value.items():
                yield f"{key}.{sub}", raw
        else:
            yield key, value


def _check_whole(s: Settings) -> None:
    if s.sidecar:
        if not re.fullmatch(r"[^\s,]+:\d{1,5}(,\d{1,5})?", s.node.node_address):
            raise SettingsError(f"bad value for setting node.node_address: {s.node.node_address!r} "
                                "(must be HOST:GRPC_PORT[,REST_PORT])")
        names = [p.name for p in s.ring.peers]
        if s.discovery.backend != "static" and not s.ring.self_name:
            raise SettingsError(f"bad value for setting ring.self_name: '' (required with "
                                f"discovery.backend = {s.discovery.backend})")
        if s.discovery.backend == "static" and s.ring.peers and s.ring.self_name not in names:
            raise SettingsError(f"bad value for setting ring.self_name: {s.ring.self_name!r} "
                                f"(must be one of the peers: {', '.join(names)})")
    elif s.node.local_nodes < 1:
        raise SettingsError(f"bad value for setting node.local_nodes: {s.node.local_nodes!r} "
                            "(must be >= 1 without --node-address)")
    if not s.model_repository:
        raise SettingsError("bad value for setting model_repository: '' (required: --model-repository DIR)")
    if not Path(s.model_repository).is_dir():
        raise SettingsError(f"bad value for setting model_repository: {s.model_repository!r} "
                            "(not a directory)")
    if s.server.admin_port >= 0:
        check_bind(s.server.admin_bind_address, s.server.admin_token)
    if s.scale.unloads_per_minute_low >= s.scale.unloads_per_minute_high:
        raise SettingsError(f"bad value for setting scale.unloads_per_minute_low: {s.scale.unloads_per_minute_low!r} "
                            f"(must be below scale.unloads_per_minute_high, {s.scale.unloads_per_minute_high!r})")
    if s.server.rest_port > 0 and s.server.rest_port == s.server.grpc_port:
        raise SettingsError(f"bad value for setting server.rest_port: {s.server.rest_port!r} "
                            "(must differ from server.grpc_port)")


def is_loopback(address: str) -> bool:
    """``localhost`` or a loopback IP address (brackets around IPv6 allowed)."""
    host = address.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(bind_address: str, token: str) -> None:
    """Refuse an admin server reachable from other hosts without a token (SettingsError)."""
    if not token and not is_loopback(bind_address):
        raise SettingsError(
            f"bad value for setting server.admin_token: '' (required when server.admin_bind_address is "
            f"{bind_address!r}, not a loopback address: anyone who can reach it could evict and drain)")


def add_arguments(parser) -> None:
    """One flag per setting that has one; defaults stay None so unset flags do not override."""
    parser.add_argument("--config", metavar="FILE", help="TOML settings file")
    for dotted, f in iter_fields():
        flag = f.metadata.get("flag")
        if flag and flag.startswith("--no-"):  # a switch that turns a boolean setting off
            parser.add_argument(flag, dest=dotted, action="store_const", const=False, default=None,
                                help=f"{f.metadata['doc']} (sets {dotted} = false)")
        elif flag:
            parser.add_argument(flag, dest=dotted, default=None, metavar=dotted.rsplit(".", 1)[-1].upper(),
                                help=f.metadata["doc"])
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="FIELD=VALUE",
                        help="any other setting by dotted name, e.g. --set cache.policy=lru")


def from_args(args, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from parsed arguments (see add_arguments)."""
    known = dict(iter_fields())
    overrides = {dotted: getattr(args, dotted) for dotted in known if hasattr(args, dotted)}
    for item in args.set_:
        dotted, sep, raw = item.partition("=")
        if not sep or dotted not in known:
            raise SettingsError(f"unknown setting in --set: {item!r}")
        overrides[dotted] = raw
    return load(args.config, env, overrides)


def describe() -> str:
    """Every setting with its default and docstring (for --help-settings and docs)."""
    lines = []
    for dotted, f in iter_fields():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  {dotted:<40} {default!r:<12} {f.metadata['doc']}")
    return "\n".join(lines)
