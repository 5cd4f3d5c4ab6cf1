"""Checks of deploy/ against the code: each returns a list of problems, empty when they agree.

Returning problems instead of asserting lets the tests show that every check fails on a
broken copy of a manifest (the ``*_can_fail`` tests). What each check holds the
manifests to comes from the code: ``manifests.sidecar_ports()`` (the settings' default
ports), docs/real-tfserving.md's flag table, ``tfscache.modelserver.main.FLAGS`` and
``tfscache.settings``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

import yaml

from tfscache import settings as settings_mod

from . import overlays
from .manifests import (CLI_ENV, CONSUL_HTTP_PORT, DEPLOY, DOCKERFILE, K8S, TFSCACHE_NODE_EXTENSIONS,
                        TFSERVING_ONLY_FLAGS, Instruction,
                        Pair, as_list, cli_defaults, compose_pairs, container, dockerignore_allows, env_name,
                        known_settings,
                        node_flags, node_ports, parse_dockerfile, parse_flag_args, port_number, pyproject,
                        required_tfserving_flags, sidecar_ports)


def check_dockerfile(text: str, ignore_text: str) -> list[str]:
    problems = []
    instructions = parse_dockerfile(text)
    by_kw: dict[str, list[Instruction]] = {}
    for ins in instructions:
        by_kw.setdefault(ins.keyword, []).append(ins)
    froms = by_kw.get("FROM", [])
    if len(froms) != 1 or froms[0].args.split()[0] != "python:3.11-slim":
        problems.append(f"base image must be python:3.11-slim, got {[f.args for f in froms]}")
    exposed = {int(p.split("/")[0]) for ins in by_kw.get("EXPOSE", []) for p in ins.args.split()}
    if exposed != set(sidecar_ports().values()):
        problems.append(f"EXPOSE {sorted(exposed)} != the settings' default ports {sidecar_ports()}")
    installs = [ins.args for ins in by_kw.get("RUN", []) if re.search(r"\bpip\b.*\binstall\b", ins.args)]
    if not installs:
        problems.append("no pip install of tfscache")
    for run in installs:
        for command in run.split("&&"):
            words = shlex.split(command)
            if "pip" not in words or "install" not in words:
                continue
            args = words[words.index("install") + 1:]
            constraints = [value for flag, value in zip(args, args[1:]) if flag in ("-c", "--constraint")]
            targets = [w for w in args if not w.startswith("-") and w not in constraints]
            if targets != ["."]:
                problems.append(f"pip must install the project alone, without extras: {command.strip()!r}")
            if constraints != ["constraints.txt"]:
                problems.append(f"pip must install with -c constraints.txt (the tested versions): {command.strip()!r}")
            if any("tensorflow" in w for w in words):
                problems.append(f"the sidecar image must not install tensorflow: {command.strip()!r}")
    base_deps = pyproject()["project"]["dependencies"]
    if any(d.lower().startswith("tensorflow") for d in base_deps):
        problems.append(f"pyproject's base dependencies pull tensorflow: {base_deps}")
    users = by_kw.get("USER", [])
    if not users or users[-1].args.split(":")[0] in ("root", "0"):
        problems.append(f"the image must run as a non-root user, USER = {[u.args for u in users]}")
    entry = by_kw.get("ENTRYPOINT", [Instruction("ENTRYPOINT", "")])[-1].exec_form()
    if entry != ["tfscache", "serve"]:
        problems.append(f"ENTRYPOINT must be [\"tfscache\", \"serve\"], got {entry}")
    patterns = [line.strip() for line in ignore_text.splitlines() if line.strip() and not line.startswith("#")]
    for ins in by_kw.get("COPY", []):
        for source in ins.args.split()[:-1]:
            if not source.startswith("--") and not dockerignore_allows(patterns, source.rstrip("/")):
                problems.append(f"COPY {source}: excluded from the build context by Dockerfile.dockerignore")
    return problems


def check_env_names(env: Mapping[str, str]) -> list[str]:
    """Every TFSCACHE_* variable names a setting (settings.load silently ignores others)."""
    known = {env_name(d) for d in known_settings()} | CLI_ENV
    return [f"{key} is not a tfscache setting (settings.py knows {sorted(known)})"
            for key in env if key.startswith("TFSCACHE_") and key not in known]


def check_tfserving(command: list[str], args: list[str]) -> list[str]:
    """The node runs tensorflow_model_server with the flags docs/real-tfserving.md requires."""
    problems = []
    if command != ["tensorflow_model_server"]:
        problems.append(f"run tensorflow_model_server itself (not the image's entrypoint script), got {command}")
    try:
        flags = parse_flag_args(args)
    except ValueError as exc:
        return problems + [str(exc)]
    node_main = node_flags()
    for name in flags:
        if name in TFSERVING_ONLY_FLAGS:
            if TFSERVING_ONLY_FLAGS[name] is bool and flags[name] not in ("true", "false"):
                problems.append(f"--{name}={flags[name]} must be true or false")
        elif name not in node_main.FLAGS or name in TFSCACHE_NODE_EXTENSIONS:
            problems.append(f"--{name} is not a tensorflow_model_server flag")
    try:  # the same parser and types as tensorflow_model_server's flags (tfscache node's table)
        node_main.parse_flags([f"--{k}={v}" for k, v in flags.items() if k in node_main.FLAGS])
    except node_main.FlagError as exc:
        problems.append(str(exc))
        return problems
    for name in required_tfserving_flags():
        if name not in flags:
            problems.append(f"--{name} missing (docs/real-tfserving.md requires it)")
    if problems:
        return problems

    def integer(name: str) -> int | None:
        if not re.fullmatch(r"-?\d+", flags[name]):
            problems.append(f"--{name}={flags[name]} must be an integer for tensorflow_model_server")
            return None
        return int(flags[name])

    rules = {
        "model_config_file_poll_wait_seconds": (lambda v: v == 0, "must be 0: a poll overwrites the sidecar's config"),
        "file_system_poll_wait_seconds": (lambda v: v >= 1, "must be >= 1 (0 makes reloads hang)"),
        "max_num_load_retries": (lambda v: 0 <= v <= 1, "must be 0 or 1"),
        "num_load_threads": (lambda v: v >= 2, "must be >= 2"),
        "num_unload_threads": (lambda v: v >= 1, "must be >= 1"),
        "load_retry_interval_micros": (lambda v: v <= 1_000_000, "must be small (<= 1 s)"),
    }
    for name, (ok, why) in rules.items():
        value = integer(name)
        if value is not None and not ok(value):
            problems.append(f"--{name}={value}: {why}")
    return problems


def check_node_matches(flags: Mapping[str, str], sidecar: settings_mod.Settings) -> list[str]:
    """The sidecar's node.node_address and deadlines fit the TF Serving flags next to it."""
    problems = []
    host, grpc, rest = node_ports(sidecar)
    if host not in ("127.0.0.1", "localhost"):
        problems.append(f"node.node_address {sidecar.node.node_address!r}: the node shares the sidecar's "
                        "network namespace, use 127.0.0.1")
    if str(grpc) != flags.get("port") or str(rest) != flags.get("rest_api_port"):
        problems.append(f"node.node_address {sidecar.node.node_address!r} != TF Serving's "
                        f"--port={flags.get('port')} --rest_api_port={flags.get('rest_api_port')}")
    own = set(sidecar_ports().values()) | {p for p in (sidecar.server.admin_port, sidecar.server.metrics_port) if p > 0}
    clash = {grpc, rest} & own
    if clash:
        problems.append(f"TF Serving's ports {sorted(clash)} clash with the sidecar's own ports in the "
                        "shared network namespace")
    worst = (int(flags["file_system_poll_wait_seconds"])
             + int(flags["max_num_load_retries"]) * int(flags["load_retry_interval_micros"]) / 1e6)
    if sidecar.cache.reload_deadline_s <= worst:
        problems.append(f"cache.reload_deadline_s={sidecar.cache.reload_deadline_s} must exceed one poll plus "
                        f"the retries ({worst} s) plus the slowest load")
    return problems


def check_empty_config(path: Path) -> list[str]:
    """TF Serving's --model_config_file holds an empty model_config_list, not nothing."""
    from tfscache.modelserver.config import parse_model_server_config

    config = parse_model_server_config(path.read_text())
    if config.WhichOneof("config") != "model_config_list" or len(config.model_config_list.config):
        return [f"{path.name} must hold exactly `model_config_list {{}}` (docs/upstream/"
                'tfserving.md, "Hazards that follow from the ordering")']
    return []


def check_discovery(section: Mapping[str, str], consul_host: str | None) -> list[str]:
    problems = []
    if section.get("backend") != "consul":
        problems.append(f"discovery.backend must be consul, got {section.get('backend')!r}")
    if section.get("service_name") != "tfscache":
        problems.append(f"discovery.service_name must be tfscache, got {section.get('service_name')!r}")
    match = re.fullmatch(r"https?://([^/:]+):(\d+)/?", section.get("consul_address", ""))
    if not match:
        problems.append(f"discovery.consul_address must be http://HOST:PORT, got {section.get('consul_address')!r}")
    elif (consul_host is not None and match.group(1) != consul_host) or int(match.group(2)) != CONSUL_HTTP_PORT:
        problems.append(f"discovery.consul_address {section['consul_address']!r} is not the Consul agent "
                        f"({consul_host}:{CONSUL_HTTP_PORT})")
    if not section.get("advertise_host"):
        problems.append("discovery.advertise_host must be set: other sidecars forward to it")
    return problems


def check_compose(compose: Mapping) -> list[str]:
    problems = []
    services = compose["services"]
    consul = [n for n, s in services.items() if str(s.get("image", "")).startswith("hashicorp/consul:")]
    if len(consul) != 1:
        problems.append(f"one real Consul (hashicorp/consul image) expected, got {consul}")
    else:
        command = as_list(services[consul[0]].get("command"))
        if command[:1] != ["agent"] or "-dev" not in command:
            problems.append(f"Consul must run as a dev agent: {command}")
    nodes = [n for n, s in services.items() if str(s.get("image", "")).startswith("tensorflow/serving:")]
    pairs = compose_pairs(compose)
    for name, service in services.items():
        mode = service.get("network_mode", "")
        if mode.startswith("service:") and mode.split(":", 1)[1] not in services:
            problems.append(f"{name}: network_mode {mode} names no service")
    if len(nodes) != 3:
        problems.append(f"three tensorflow/serving containers expected, got {nodes}")
    if sorted(p.extra["node_service"] for p in pairs) != sorted(nodes):
        problems.append("each tensorflow/serving container needs exactly one sidecar in its network namespace")
    for pair in pairs:
        sidecar, node_service = pair.extra["sidecar"], pair.extra["node_service"]
        if sidecar.get("pid") != f"service:{node_service}":
            problems.append(f"{pair.name}: pid must be service:{node_service} (psutil measures TF Serving)")
        if consul and consul[0] not in (sidecar.get("depends_on") or []):
            problems.append(f"{pair.name}: must depend on {consul[0]}")
        build = sidecar.get("build") or {}
        if (DEPLOY / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() != DOCKERFILE:
            problems.append(f"{pair.name}: must be built from deploy/Dockerfile")
    names = [p.sidecar_env.get(env_name("ring.self_name")) for p in pairs]
    if None in names or len(set(names)) != len(names):
        problems.append(f"each sidecar needs its own {env_name('ring.self_name')}: {names}")
    # Clients need gRPC and REST on the host; other sidecar ports (e.g. an admin port bound to
    # 127.0.0.1 by default) may stay inside.
    published = {int(str(p).split(":")[-1]) for s in services.values() if not str(s.get("image", "")).startswith(
        "hashicorp/consul") for p in s.get("ports", [])}
    ports = sidecar_ports()
    needed = {ports["server.grpc_port"], ports["server.rest_port"]}
    if not needed <= published <= set(ports.values()):
        problems.append(f"the sidecar ports published {sorted(published)} must include gRPC and REST and be "
                        f"among the settings' defaults {ports}")
    return problems


def check_ops_ports(sidecar: settings_mod.Settings, env: Mapping[str, str],
                    container_ports: set[int] | None = None) -> list[str]:
    """The admin API and the metrics port are on, where the CLIs inside the sidecar look for them.

    The admin API on 127.0.0.1 (no token needed; scripts reach it through ``kubectl exec`` or
    ``port-forward``), on the port ``tfscache models|drain`` use without ``--address``; the
    metrics port on the front ends' (wildcard) bind address, so Prometheus reaches it, and
    where ``tfscache status`` looks (``TFSCACHE_STATUS_ADDRESS`` or its default).
    ``container_ports`` (Kubernetes): the metrics port is declared, the loopback admin port not.
    """
    problems = []
    s = sidecar.server
    defaults = cli_defaults()
    if s.admin_port <= 0:
        problems.append(f"server.admin_port is {s.admin_port}: tfscache drain and tfscache prewarm "
                        "need the admin API on a fixed port")
    elif s.admin_bind_address != "127.0.0.1":
        problems.append(f"server.admin_bind_address {s.admin_bind_address!r}: keep the admin API on 127.0.0.1")
    admin_address = env.get("TFSCACHE_ADMIN_ADDRESS", defaults["TFSCACHE_ADMIN_ADDRESS"])
    if s.admin_port > 0 and admin_address != f"127.0.0.1:{s.admin_port}":
        problems.append(f"tfscache models/drain in the sidecar call {admin_address}, but the admin API is on "
                        f"127.0.0.1:{s.admin_port}")
    if s.metrics_port <= 0:
        problems.append(f"server.metrics_port is {s.metrics_port}: Prometheus and tfscache status need it")
    else:
        status_address = env.get("TFSCACHE_STATUS_ADDRESS", defaults["TFSCACHE_STATUS_ADDRESS"])
        if status_address != f"127.0.0.1:{s.metrics_port}":
            problems.append(f"tfscache status in the sidecar reads {status_address}, but /status is on port "
                            f"{s.metrics_port} (set TFSCACHE_STATUS_ADDRESS)")
        if s.bind_address not in ("0.0.0.0", "::"):
            problems.append(f"server.bind_address {s.bind_address!r}: the metrics port must be reachable by Prometheus")
    used = [p for p in (s.grpc_port, s.rest_port, s.admin_port, s.metrics_port) if p > 0]
    if len(set(used)) != len(used):
        problems.append(f"gRPC, REST, admin and metrics ports must differ: {used}")
    if container_ports is not None:
        if s.metrics_port > 0 and s.metrics_port not in container_ports:
            problems.append(f"the metrics port {s.metrics_port} must be a containerPort of the sidecar")
        if s.admin_port > 0 and s.admin_port in container_ports:
            problems.append(f"the admin port {s.admin_port} is bound to 127.0.0.1: not a containerPort")
    return problems


def check_prometheus(objects: Mapping, metrics_port: int) -> list[str]:
    """The pod template asks Prometheus to scrape /metrics on the sidecar's metrics port."""
    sts = objects.get(("StatefulSet", "tfscache"))
    if sts is None:
        return ["no StatefulSet tfscache"]
    annotations = sts["spec"]["template"]["metadata"].get("annotations") or {}
    wanted = {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port),
              "prometheus.io/path": "/metrics"}
    return [f"pod annotation {key} must be {value!r} (server.metrics_port), got {annotations.get(key)!r}"
            for key, value in wanted.items() if annotations.get(key) != value]


def check_k8s(objects: Mapping, grace_s: float, extra_ports: frozenset[int] = frozenset()) -> list[str]:
    problems = []
    sts = objects.get(("StatefulSet", "tfscache"))
    if sts is None:
        return ["no StatefulSet tfscache"]
    spec = sts["spec"]["template"]["spec"]
    if spec.get("shareProcessNamespace") is not True:
        problems.append("shareProcessNamespace must be true: the sidecar measures TF Serving's memory with psutil")
    names = sorted(c["name"] for c in spec["containers"])
    if names != ["tfscache", "tfserving"]:
        return problems + [f"two containers, tfserving and tfscache, expected: {names}"]
    node, sidecar = container(sts, "tfserving"), container(sts, "tfscache")
    ports = {p["containerPort"] for p in sidecar.get("ports", [])}
    if ports != set(sidecar_ports().values()) | set(extra_ports):
        problems.append(f"sidecar containerPorts {sorted(ports)} != the settings' defaults {sidecar_ports()} "
                        f"plus the ports the config turns on {sorted(extra_ports)}")
    grpc_port = sidecar_ports()["server.grpc_port"]
    readiness = sidecar.get("readinessProbe", {})
    if readiness.get("grpc", {}).get("port") != grpc_port:
        problems.append(f"sidecar readiness must be gRPC health on port {grpc_port}: {readiness}")
    liveness = sidecar.get("livenessProbe", {})
    probe = liveness.get("grpc") or liveness.get("tcpSocket") or {}
    if port_number(sidecar, probe.get("port")) != grpc_port:
        problems.append(f"sidecar liveness must probe the gRPC port {grpc_port}: {liveness}")
    for c in (node, sidecar):
        resources = c.get("resources", {})
        if not resources.get("requests", {}).get("memory") or not resources.get("limits", {}).get("memory"):
            problems.append(f"{c['name']}: memory request and limit required")
        if not resources.get("requests", {}).get("cpu"):
            problems.append(f"{c['name']}: cpu request required")
    if not sidecar.get("securityContext", {}).get("runAsNonRoot"):
        problems.append("sidecar must run as non-root")
    # Shutdown order: TF Serving outlives the sidecar's drain; the pod's grace covers both.
    pre_stop = node.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] and len(pre_stop) == 2 else 0
    if sleep <= grace_s:
        problems.append(f"tfserving preStop must sleep longer than the sidecar's server.grace_s ({grace_s} s): "
                        f"{pre_stop}")
    if spec.get("terminationGracePeriodSeconds", 30) <= max(sleep, grace_s):
        problems.append("terminationGracePeriodSeconds must exceed the tfserving preStop sleep and server.grace_s")
    # Services
    headless = objects.get(("Service", sts["spec"].get("serviceName")))
    if headless is None or headless["spec"].get("clusterIP") != "None":
        problems.append(f"serviceName {sts['spec'].get('serviceName')!r} must be a headless Service")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    clients = [o for (kind, _), o in objects.items() if kind == "Service" and o["spec"].get("clusterIP") != "None"]
    if not clients:
        problems.append("no client Service")
    for svc in [o for (kind, _), o in objects.items() if kind == "Service"]:
        selector = svc["spec"].get("selector", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            problems.append(f"Service {svc['metadata']['name']} does not select the StatefulSet's pods")
        for p in svc["spec"]["ports"]:
            if port_number(sidecar, p.get("targetPort", p["port"])) not in set(sidecar_ports().values()):
                problems.append(f"Service {svc['metadata']['name']} port {p} does not reach a sidecar port")
            if p["port"] not in set(sidecar_ports().values()):
                problems.append(f"Service {svc['metadata']['name']} port {p['port']} is not a tfscache port")
    # Volumes exist
    for volume in spec.get("volumes", []):
        if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in objects:
            problems.append(f"volume {volume['name']}: no ConfigMap {volume['configMap']['name']}")
        claim = volume.get("persistentVolumeClaim")
        if claim and ("PersistentVolumeClaim", claim["claimName"]) not in objects:
            problems.append(f"volume {volume['name']}: no PersistentVolumeClaim {claim['claimName']}")
    return problems


def check_kustomization(root: Path = K8S) -> list[str]:
    """Every kustomization under deploy/k8s names exactly the YAML files next to it (resources, patches)."""
    problems = []
    for path in sorted(root.rglob("kustomization.yaml")):
        named, present = overlays.files(path.parent)
        if named != present:
            problems.append(f"{path.relative_to(root.parent)} names {sorted(named)} but its directory has "
                            f"{sorted(present)}")
    return problems


def check_shared_volume(pair: Pair, model_repository: str) -> list[str]:
    """The model repository is mounted read-only at the same path in both containers, from one source."""
    node, side = pair.tfserving_mounts.get(model_repository), pair.sidecar_mounts.get(model_repository)
    if node is None or side is None:
        return [f"{pair.name}: model_repository {model_repository!r} must be mounted in both containers "
                f"(TF Serving: {sorted(pair.tfserving_mounts)}, sidecar: {sorted(pair.sidecar_mounts)})"]
    problems = []
    if node["source"] != side["source"]:
        problems.append(f"{pair.name}: {model_repository} comes from {node['source']!r} and {side['source']!r}")
    if not (node["read_only"] and side["read_only"]):
        problems.append(f"{pair.name}: the model repository must be mounted read-only in both containers")
    return problems


def check_memory(pair: Pair, sidecar: settings_mod.Settings) -> list[str]:
    """The sidecar's memory cap is set and fits under TF Serving's container limit."""
    cap, limit = sidecar.cache.memory_per_node, pair.tfserving_memory_limit
    if not limit:
        return [f"{pair.name}: TF Serving needs a memory limit"]
    if not 0 < cap < limit:
        return [f"{pair.name}: cache.memory_per_node ({cap}) must be set and below TF Serving's memory "
                f"limit ({limit}); the node also needs memory for requests"]
    return []
