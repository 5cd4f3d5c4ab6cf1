"""The discovery backends, picked by name (``discovery.backend``) from ``BACKENDS``.

A backend is one module under ``tfscache/discovery/`` plus one row here. The row says what the
rest of tfscache needs to know of it without importing it: the class (a ``"module:attribute"``
string, imported only when chosen), which ``[discovery]`` settings become which constructor
options, the settings it requires, and how this sidecar enters the ring with it. Settings
validation (tfscache.settings) and ``discovery.from_settings`` read the rows; nothing else
names a backend.

Adding a backend: a module with a ``Discovery`` subclass (tfscache.discovery), its settings in
``DiscoverySection`` (tfscache/settings/sections.py, prefixed with its name), and one row below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# Every backend's constructor takes these, from the [discovery] settings of the same names.
COMMON_OPTIONS = {"start_timeout_s": "start_timeout_s", "retry_max_s": "retry_max_s"}
# A registry's backend (it registers this sidecar and watches the others): also these.
REGISTRY_OPTIONS = {"service": "service_name", "ttl_s": "ttl_s",
                    "request_timeout_s": "request_timeout_s"}


@dataclass(frozen=True)
class DiscoveryBackend:
    """One discovery backend: where it lives and what it takes from the settings."""

    summary: str  # one phrase for the setting's help: "static (ring.peers, re-read on SIGHUP)"
    factory: str  # the Discovery class, "module:attribute"
    options: Mapping[str, str]  # constructor keyword -> [discovery] setting, beyond COMMON_OPTIONS
    registers: bool  # it registers this sidecar: ring.self_name is required, discovery.join applies
    # its members are the config file's ring.peers (re-read on reload)
    peers_from_ring: bool = False
    required: tuple[str, ...] = field(default=())  # [discovery] settings that must not be empty


# The first row is the default backend.
BACKENDS: dict[str, DiscoveryBackend] = {
    "static": DiscoveryBackend(
        "static (ring.peers, re-read on SIGHUP)", "tfscache.discovery.static:StaticDiscovery",
        {}, registers=False, peers_from_ring=True),
    "consul": DiscoveryBackend(
        "consul", "tfscache.discovery.consul:ConsulDiscovery",
        {**REGISTRY_OPTIONS, "address": "consul_address", "token": "consul_token",
         "wait_s": "consul_wait_s",
         "deregister_critical_after_s": "consul_deregister_critical_after_s"},
        registers=True),
    "etcd": DiscoveryBackend(
        "etcd", "tfscache.discovery.etcd:EtcdDiscovery",
        {**REGISTRY_OPTIONS, "endpoints": "etcd_endpoints", "prefix": "etcd_prefix"},
        registers=True),
    "dns": DiscoveryBackend(
        "dns", "tfscache.discovery.dns:DnsDiscovery",
        {"dns_name": "dns_name", "record": "dns_record", "grpc_port": "dns_port_grpc",
         "rest_port": "dns_port_rest", "interval_s": "dns_interval_s", "server": "dns_server",
         "request_timeout_s": "request_timeout_s"},
        registers=False, required=("dns_name",)),
}
DEFAULT_BACKEND = next(iter(BACKENDS))


def one_of(names) -> str:
    """``a, b, c or d``: the names as the settings' help and errors list them."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
