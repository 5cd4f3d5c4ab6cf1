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
import importlib.util
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from tfscache import tls
from tfscache.discovery.table import BACKENDS as DISCOVERY_BACKENDS
from tfscache.kinds.table import KINDS
from tfscache.settings.sections import (
    CacheSection,
    CopiesSection,
    DiscoverySection,
    NodeSection,
    RingSection,
    ScaleSection,
    ServerSection,
    StorageSection,
    TlsSection,
    setting,
)
from tfscache.units import parse_bytes

REMOTE_SCHEMES = ("s3", "gs", "az")  # tfscache.storage.STORES' keys (that package imports obstore)
_BUCKET = {"s3": "BUCKET", "gs": "BUCKET", "az": "CONTAINER"}

__all__ = [
    "CacheSection",
    "CopiesSection",
    "DiscoverySection",
    "NodeSection",
    "RingSection",
    "ScaleSection",
    "ServerSection",
    "Settings",
    "SettingsError",
    "StorageSection",
    "TlsSection",
    "describe",
    "from_args",
    "load",
    "parse_bytes",
]

class SettingsError(ValueError):
    """A setting with a bad value; the message names the field and the value."""


@dataclass
class Settings:
    """Everything `tfscache serve` reads."""

    model_repository: str = setting(
        "",
        "directory holding NAME/VERSION/saved_model.pb, or s3://BUCKET/PREFIX, "
        "gs://BUCKET/PREFIX, az://CONTAINER/PREFIX (docs/storage.md)",
        flag="--model-repository",
    )
    cache: CacheSection = field(default_factory=CacheSection)
    ring: RingSection = field(default_factory=RingSection)
    copies: CopiesSection = field(default_factory=CopiesSection)
    node: NodeSection = field(default_factory=NodeSection)
    server: ServerSection = field(default_factory=ServerSection)
    log_json: bool = setting(False, "log JSON objects, one per line, instead of text (--log-json)")
    discovery: DiscoverySection = field(default_factory=DiscoverySection)
    scale: ScaleSection = field(default_factory=ScaleSection)
    storage: StorageSection = field(default_factory=StorageSection)
    tls: TlsSection = field(default_factory=TlsSection)

    @property
    def sidecar(self) -> bool:
        """One node given by address rather than local children."""
        return bool(self.node.node_address)

    @property
    def moves_across(self) -> bool:
        """Whether demotions and promotions go across nodes (docs/tiers.md, "Host-tier nodes"):
        ``cache.demote = host`` with host-tier nodes (embedded), or in sidecar mode on a host-tier
        sidecar, or on a GPU-tier one whose kind cannot demote in place (Triton does that)."""
        if self.cache.demote != "host":
            return False
        if not self.sidecar:
            return bool(self.node.local_host_nodes)
        kind = KINDS.get(self.node.backend)
        return self.node.node_tier == "host" or (kind is not None and not kind.demotes_in_place)


_SECTIONS = ("cache", "ring", "copies", "node", "server", "discovery", "scale", "storage", "tls")


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
        _check_node_is_not_self(s)
        names = [p.name for p in s.ring.peers]
        backend = DISCOVERY_BACKENDS[s.discovery.backend]
        if not backend.peers_from_ring and not s.ring.self_name:
            raise SettingsError(f"bad value for setting ring.self_name: '' (required with "
                                f"discovery.backend = {s.discovery.backend})")
        for name in backend.required:
            if not getattr(s.discovery, name):
                raise SettingsError(f"bad value for setting discovery.{name}: '' (required with "
                                    f"discovery.backend = {s.discovery.backend})")
        if backend.peers_from_ring and s.ring.peers and s.ring.self_name not in names:
            raise SettingsError(f"bad value for setting ring.self_name: {s.ring.self_name!r} "
                                f"(must be one of the peers: {', '.join(names)})")
        own = next((p for p in s.ring.peers if p.name == s.ring.self_name), None)
        if backend.peers_from_ring and own is not None and own.tier != s.node.node_tier:
            raise SettingsError(f"bad value for setting node.node_tier: {s.node.node_tier!r} "
                                f"(ring.peers says {own.name} is a {own.tier}-tier sidecar)")
    elif s.node.local_nodes < 1:
        raise SettingsError(f"bad value for setting node.local_nodes: {s.node.local_nodes!r} "
                            "(must be >= 1 without --node-address)")
    if not s.model_repository:
        raise SettingsError(
            "bad value for setting model_repository: '' (required: --model-repository DIR)"
        )
    if remote_url(s.model_repository):
        problem = remote_url(s.model_repository)
        if problem is not True:
            raise SettingsError(
                f"bad value for setting model_repository: {s.model_repository!r} ({problem})"
            )
        if importlib.util.find_spec("obstore") is None:
            raise SettingsError(
                f"bad value for setting model_repository: {s.model_repository!r} (a bucket needs "
                "the storage extra, which is not installed: pip install 'tfscache[storage]')"
            )
    elif not Path(s.model_repository).is_dir():
        raise SettingsError(f"bad value for setting model_repository: {s.model_repository!r} "
                            "(not a directory, nor an s3://, gs:// or az:// URL)")
    if s.server.admin_port >= 0:
        check_bind(s.server.admin_bind_address, s.server.admin_token)
    if s.scale.unloads_per_minute_low >= s.scale.unloads_per_minute_high:
        raise SettingsError(
            f"bad value for setting scale.unloads_per_minute_low: {s.scale.unloads_per_minute_low!r} "
            f"(must be below scale.unloads_per_minute_high, {s.scale.unloads_per_minute_high!r})"
        )
    problem = tls.check(s.tls)
    if problem:
        raise SettingsError(
            f"bad value for setting tls.{problem[0]}: {problem[1]!r} ({problem[2]})"
        )
    kind = KINDS.get(s.node.backend)
    if s.node.local_host_nodes and s.sidecar:
        raise SettingsError(f"bad value for setting node.local_host_nodes: "
                            f"{s.node.local_host_nodes!r} (embedded mode only: a sidecar has "
                            "one node)")
    if s.moves_across and (s.server.workers > 1 or s.server.data_plane == "haproxy"):
        raise SettingsError(f"bad value for setting cache.demote: {s.cache.demote!r} (host-tier "
                            "nodes are routed by this process's router only: not with "
                            "server.workers > 1 or server.data_plane = haproxy yet; "
                            "docs/tiers.md)")
    if s.node.node_tier != "gpu" and not s.sidecar:
        raise SettingsError(f"bad value for setting node.node_tier: {s.node.node_tier!r} "
                            "(sidecar mode only: embedded, --local-host-nodes M starts host-tier "
                            "nodes)")
    if s.node.node_tier == "host" and s.cache.demote != "host":
        raise SettingsError("bad value for setting node.node_tier: 'host' (needs cache.demote = "
                            "host, as on the gpu sidecars; docs/tiers.md)")
    if (s.cache.demote != "none" and kind is not None and not kind.demotes_in_place
            and not s.node.local_host_nodes and not s.sidecar):
        raise SettingsError(f"bad value for setting cache.demote: {s.cache.demote!r} (node.backend "
                            f"{s.node.backend} cannot move a model off the GPU in place: it "
                            "needs host-tier nodes, --local-host-nodes M; docs/tiers.md)")
    if s.server.data_plane == "haproxy":
        if s.server.workers > 1:
            raise SettingsError(f"bad value for setting server.workers: {s.server.workers!r} "
                                "(must be 1 with server.data_plane = haproxy: HAProxy carries "
                                "the warm requests the workers would)")
        if s.server.request_log and s.server.routed_requests == "counted":
            raise SettingsError("bad value for setting server.routed_requests: 'counted' (the "
                                "request log, server.request_log, needs each routed request "
                                "logged: routed_requests = logged)")
    if s.server.rest_port > 0 and s.server.rest_port == s.server.grpc_port:
        raise SettingsError(f"bad value for setting server.rest_port: {s.server.rest_port!r} "
                            "(must differ from server.grpc_port)")


def _check_node_is_not_self(s: Settings) -> None:
    """A sidecar whose node address is one of its own front end's ports would send every load and
    request to itself: refused. Only for this host's addresses (a port is only ours here)."""
    host_port, _, rest = s.node.node_address.partition(",")
    host, port = host_port.rsplit(":", 1)
    host = host.strip("[]").lower()
    if not (host == "localhost" or host.startswith("127.") or host in ("::1", s.server.bind_address)):
        return
    own = {s.server.grpc_port: "server.grpc_port", s.server.rest_port: "server.rest_port"}
    for node_port in (int(port), int(rest) if rest else None):
        if node_port and node_port > 0 and node_port in own:
            raise SettingsError(f"bad value for setting node.node_address: {s.node.node_address!r} "
                                f"(port {node_port} is tfscache's own {own[node_port]}: the node "
                                "must listen on other ports)")


def remote_url(url: str) -> bool | str:
    """False for a local path; True for a well-formed object-store URL (s3://, gs://, az://);
    otherwise why the URL is bad. The store's library is not imported here."""
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
        return False
    if scheme not in REMOTE_SCHEMES:
        return f"unsupported scheme {scheme}://: expected a directory or one of " + \
            ", ".join(f"{s}://{_BUCKET[s]}/PREFIX" for s in REMOTE_SCHEMES)
    bucket = rest.partition("/")[0]
    if not bucket or "?" in rest or "#" in rest:
        return f"must be {scheme}://{_BUCKET[scheme]}/PREFIX"
    return True


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
            f"{bind_address!r}, not a loopback address: anyone who can reach it could evict and drain)"
        )


def add_arguments(parser) -> None:
    """One flag per setting that has one; defaults stay None so unset flags do not override."""
    parser.add_argument("--config", metavar="FILE", help="TOML settings file")
    for dotted, f in iter_fields():
        flag = f.metadata.get("flag")
        if flag and flag.startswith("--no-"):  # a switch that turns a boolean setting off
            parser.add_argument(flag, dest=dotted, action="store_const", const=False, default=None,
                                help=f"{f.metadata['doc']} (sets {dotted} = false)")
        elif flag:
            parser.add_argument(
                flag,
                dest=dotted,
                default=None,
                metavar=dotted.rsplit(".", 1)[-1].upper(),
                help=f.metadata["doc"],
            )
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
