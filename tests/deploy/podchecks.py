"""Checks of the Kubernetes pod around tfscache (issue 14 item 5, issue 13's deploy part).

Like checks.py, each returns a list of problems (empty when the manifests agree with the code):
both containers locked down; TF Serving's own gRPC health as its probes and its monitoring
config from a ConfigMap; a PodDisruptionBudget and topology spread that keep a model's two
replicas apart; DNS discovery through the StatefulSet's headless Service; the disk tier shared
between the containers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .manifests import (DEPLOY, K8S_EXAMPLE_ENV, Pair, container, env_name, k8s_quantity, parse_flag_args,
                        port_number, sidecar_ports)

MONITORING_PATH = "/monitoring/prometheus/metrics"


def _labels(sts: Mapping) -> dict:
    return sts["spec"]["template"]["metadata"]["labels"]


def _selects(selector: Mapping | None, labels: Mapping) -> bool:
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def check_security(sts: Mapping) -> list[str]:
    """Every container: non-root, read-only root file system, no privilege escalation, no capabilities."""
    problems = []
    pod = sts["spec"]["template"]["spec"].get("securityContext", {})
    for c in sts["spec"]["template"]["spec"]["containers"]:
        ctx = {**{k: pod[k] for k in ("runAsNonRoot", "runAsUser") if k in pod}, **c.get("securityContext", {})}
        if ctx.get("runAsNonRoot") is not True or ctx.get("runAsUser", 0) == 0:
            problems.append(f"{c['name']}: must run as non-root (runAsNonRoot and a runAsUser other than 0)")
        if ctx.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{c['name']}: readOnlyRootFilesystem must be true")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in (ctx.get("capabilities") or {}).get("drop", []) or (ctx.get("capabilities") or {}).get("add"):
            problems.append(f"{c['name']}: capabilities must drop ALL and add none")
    return problems


def check_writable(pair: Pair, paths: list[str]) -> list[str]:
    """The sidecar can write where its settings say (its root file system is read-only)."""
    mounts = pair.sidecar_mounts
    return [f"{pair.name}: the sidecar writes {path}, which must be a writable mount (mounts: {sorted(mounts)})"
            for path in paths if path and not any(path == m or path.startswith(m.rstrip("/") + "/")
                                                  for m, v in mounts.items() if not v["read_only"])]


def check_tfserving_health(node: Mapping) -> list[str]:
    """TF Serving serves grpc.health.v1 (--enable_grpc_healthcheck_service) and its probes use it."""
    flags = parse_flag_args(node.get("args", []))
    problems = []
    if flags.get("enable_grpc_healthcheck_service") != "true":
        problems.append("tfserving: --enable_grpc_healthcheck_service=true is required for its gRPC probes")
    port = int(flags.get("port", 0))
    for probe in ("startupProbe", "livenessProbe"):
        grpc = node.get(probe, {}).get("grpc")
        if not grpc or port_number(node, grpc.get("port")) != port:
            problems.append(f"tfserving {probe} must be gRPC health on --port ({port}): {node.get(probe)}")
    return problems


def monitoring_fields(text: str) -> dict[str, str] | None:
    """``prometheus_config { enable: true, path: "..." }`` (text-format MonitoringConfig) as
    {field: value}; None when the text is not that message. (tensorflow-serving-api's wheel
    ships no monitoring_config_pb2, so the one message is read here.)"""
    match = re.fullmatch(r"\s*prometheus_config\s*\{([^{}]*)\}\s*", re.sub(r"#.*", "", text))
    if not match:
        return None
    fields = re.findall(r"(\w+)\s*:\s*(\"[^\"]*\"|\w+)\s*[,;]?", match.group(1))
    if re.sub(r"(\w+)\s*:\s*(\"[^\"]*\"|\w+)\s*[,;]?", "", match.group(1)).strip():
        return None  # something else in there
    return {name: value.strip('"') for name, value in fields}


def check_monitoring(pair: Pair) -> list[str]:
    """--monitoring_config_file is a mounted ConfigMap file that turns on TF Serving's Prometheus page."""
    path = parse_flag_args(pair.tfserving_args).get("monitoring_config_file")
    if not path:
        return [f"{pair.name}: tfserving needs --monitoring_config_file (its own metrics)"]
    text = pair.extra["read"](pair.tfserving_mounts, path)
    if text is None:
        return [f"{pair.name}: --monitoring_config_file={path} is not a mounted ConfigMap file"]
    fields = monitoring_fields(text)
    if fields is None:
        return [f"{pair.name}: {path} is not a MonitoringConfig with a prometheus_config: {text!r}"]
    problems = []
    if fields.get("enable") != "true" or fields.get("path") != MONITORING_PATH:
        problems.append(f"{pair.name}: {path} must enable prometheus_config at {MONITORING_PATH}: {fields}")
    shared = DEPLOY / "tfserving" / "monitoring.config"
    if shared.is_file() and monitoring_fields(shared.read_text()) != fields:
        problems.append(f"{pair.name}: {path} differs from deploy/tfserving/monitoring.config")
    return problems


def check_pdb(objects: Mapping, replicas_per_model: int) -> list[str]:
    """A PodDisruptionBudget over the pods that never lets a model's replicas all go at once."""
    sts = objects[("StatefulSet", "tfscache")]
    pdbs = [o for (kind, _), o in objects.items()
            if kind == "PodDisruptionBudget" and _selects(o["spec"].get("selector"), _labels(sts))]
    if len(pdbs) != 1:
        return [f"one PodDisruptionBudget must select the StatefulSet's pods, found {len(pdbs)}"]
    spec, replicas = pdbs[0]["spec"], sts["spec"].get("replicas", 1)
    unavailable = spec.get("maxUnavailable", replicas - spec["minAvailable"] if "minAvailable" in spec else None)
    if not isinstance(unavailable, int) or not 1 <= unavailable < replicas_per_model:
        return [f"PodDisruptionBudget: at most ring.replicas_per_model - 1 = {replicas_per_model - 1} pod(s) "
                f"may be unavailable (and at least 1, or nodes never drain), got {unavailable!r}"]
    return []


def check_spread(sts: Mapping) -> list[str]:
    """Pods spread over nodes (hard) so a node lost takes one replica of a model, not both."""
    for constraint in sts["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        if (constraint.get("topologyKey") == "kubernetes.io/hostname" and constraint.get("maxSkew") == 1
                and constraint.get("whenUnsatisfiable") == "DoNotSchedule"
                and _selects(constraint.get("labelSelector"), _labels(sts))):
            return []
    return ["topologySpreadConstraints: the pods must spread over kubernetes.io/hostname with maxSkew 1 and "
            "DoNotSchedule, selecting the StatefulSet's pods"]


def check_dns_discovery(section: Mapping, objects: Mapping, env: Mapping[str, str]) -> list[str]:
    """discovery.backend = dns reads the SRV records of the StatefulSet's headless Service, and each
    pod's ring name is the SRV target's first label: its pod name."""
    sts = objects[("StatefulSet", "tfscache")]
    service_name = sts["spec"].get("serviceName")
    problems = []
    if section.get("backend") != "dns":
        return [f"discovery.backend must be dns, got {section.get('backend')!r}"]
    if str(section.get("dns_name", "")).split(".")[0] != service_name:
        problems.append(f"discovery.dns_name {section.get('dns_name')!r} must be the headless Service "
                        f"{service_name!r} (short, or NAME.NAMESPACE.svc.cluster.local)")
    if section.get("dns_record", "srv") != "srv":
        problems.append("discovery.dns_record must be srv: A records name peers by IP, not by pod name")
    if env.get(env_name("ring.self_name")) != K8S_EXAMPLE_ENV["metadata.name"]:
        problems.append("ring.self_name must be the pod name ($(POD_NAME)), the SRV target's first label")
    headless = objects.get(("Service", service_name), {}).get("spec", {})
    if headless.get("publishNotReadyAddresses", False):
        problems.append(f"Service {service_name}: publishNotReadyAddresses must be false, so a pod joins the "
                        "rings once SERVING and leaves them when it drains")
    sidecar = container(sts, "tfscache")
    named = {p.get("name"): port_number(sidecar, p.get("targetPort", p["port"])) for p in headless.get("ports", [])}
    wanted = {"grpc": sidecar_ports()["server.grpc_port"], "rest": sidecar_ports()["server.rest_port"]}
    if named.get("grpc") != wanted["grpc"] or named.get("rest") != wanted["rest"]:
        problems.append(f"Service {service_name}: ports named grpc and rest must reach the sidecar's {wanted} "
                        f"(their SRV records are _grpc._tcp and _rest._tcp), got {named}")
    return problems


def check_disk_tier(pair: Pair, cache_dir: str, cache_bytes: int) -> list[str]:
    """A bucket's versions land in storage.cache_dir: an emptyDir the sidecar writes and TF Serving
    reads at the same path, with room for storage.cache_bytes."""
    node, side = pair.tfserving_mounts.get(cache_dir), pair.sidecar_mounts.get(cache_dir)
    if not cache_dir or node is None or side is None:
        return [f"{pair.name}: storage.cache_dir {cache_dir!r} must be mounted in both containers "
                f"(TF Serving: {sorted(pair.tfserving_mounts)}, sidecar: {sorted(pair.sidecar_mounts)})"]
    problems = []
    if node["source"] != side["source"]:
        problems.append(f"{pair.name}: {cache_dir} comes from {node['source']!r} and {side['source']!r}")
    if side["read_only"] or not node["read_only"]:
        problems.append(f"{pair.name}: the disk tier is written by the sidecar and read-only in TF Serving")
    volumes = pair.extra["statefulset"]["spec"]["template"]["spec"].get("volumes", [])
    volume = next((v for v in volumes if v["name"] == side["source"]), {})
    if "emptyDir" not in volume:
        problems.append(f"{pair.name}: volume {side['source']!r} must be an emptyDir (the pod's own tier)")
    else:
        limit = (volume["emptyDir"] or {}).get("sizeLimit")
        if not limit or k8s_quantity(limit) <= cache_bytes:
            problems.append(f"{pair.name}: the emptyDir's sizeLimit ({limit}) must exceed storage.cache_bytes "
                            f"({cache_bytes})")
    return problems
