"""deploy/k8s/: the StatefulSet (TF Serving + sidecar, one PID namespace), Services, ConfigMaps."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest

from . import checks, manifests, overlays, podchecks

OBJECTS = manifests.load_k8s()
STS = ("StatefulSet", "tfscache")
POD = ["spec", "template", "spec"]


def containers(objects) -> list[dict]:
    return objects[STS]["spec"]["template"]["spec"]["containers"]


def index(name: str) -> int:
    return [c["name"] for c in containers(OBJECTS)].index(name)


SIDECAR, NODE = POD + ["containers", index("tfscache")], POD + ["containers", index("tfserving")]


def pod_settings(tmp_path):
    pair = manifests.deployments()["k8s"][0]
    return pair, manifests.load_sidecar_settings(manifests.sidecar_config_text(pair), pair.sidecar_env, tmp_path,
                                                 tmp_path)


@pytest.fixture
def grace_s(tmp_path) -> float:
    return pod_settings(tmp_path)[1].server.grace_s


with tempfile.TemporaryDirectory() as _tmp:
    # The ports the sidecar's config turns on besides the defaults: the metrics port (the admin
    # port stays on 127.0.0.1 and is no containerPort; checks.check_ops_ports).
    EXTRA = frozenset({pod_settings(Path(_tmp))[1].server.metrics_port})


def test_manifests_agree_with_the_code(grace_s):
    assert checks.check_k8s(OBJECTS, grace_s, EXTRA) == []


def test_admin_and_metrics_ports_are_on_and_prometheus_scrapes_them(tmp_path):
    pair, settings = pod_settings(tmp_path)
    ports = {p["containerPort"] for p in pair.extra["sidecar"]["ports"]}
    assert checks.check_ops_ports(settings, pair.sidecar_env, ports) == []
    assert checks.check_prometheus(OBJECTS, settings.server.metrics_port) == []


def test_prometheus_check_can_fail(tmp_path):
    settings = pod_settings(tmp_path)[1]
    for key, value in (("prometheus.io/scrape", "false"), ("prometheus.io/port", "8500"),
                       ("prometheus.io/path", "/status")):
        objects = dict(OBJECTS)
        objects[STS] = manifests.mutated(OBJECTS[STS], ["spec", "template", "metadata", "annotations", key], value)
        assert any(key in p for p in checks.check_prometheus(objects, settings.server.metrics_port))


def test_container_port_check_of_the_ops_ports_can_fail(tmp_path):
    pair, settings = pod_settings(tmp_path)
    assert any("must be a containerPort" in p for p in checks.check_ops_ports(settings, pair.sidecar_env, {8500}))
    admin = {settings.server.admin_port, settings.server.metrics_port}
    assert any("not a containerPort" in p for p in checks.check_ops_ports(settings, pair.sidecar_env, admin))


def test_kustomization_lists_every_manifest():
    assert checks.check_kustomization() == []


def test_env_references_are_defined_before_use():
    for c in containers(OBJECTS):
        assert manifests.expand_env(c, manifests.K8S_EXAMPLE_ENV)[1] == []


def test_env_reference_check_can_fail():
    c = {"env": [{"name": "A", "value": "$(B)"}, {"name": "B", "value": "x"}]}
    assert manifests.expand_env(c, {})[1]


def headless() -> str:
    return OBJECTS[STS]["spec"]["serviceName"]


def client_service() -> tuple[str, str]:
    return next(k for k, o in OBJECTS.items() if k[0] == "Service" and o["spec"].get("clusterIP") != "None")


GRPC = manifests.sidecar_ports()["server.grpc_port"]
UNUSED = max(manifests.sidecar_ports().values()) + 1  # no tfscache port


@pytest.mark.parametrize("path, value, why", [
    (POD + ["shareProcessNamespace"], False, "shareProcessNamespace"),
    (SIDECAR + ["ports", 0, "containerPort"], UNUSED, "containerPorts"),
    (SIDECAR + ["readinessProbe"], {"tcpSocket": {"port": GRPC}}, "readiness"),
    (SIDECAR + ["readinessProbe", "grpc", "port"], GRPC + 1, "readiness"),
    (SIDECAR + ["livenessProbe"], {"httpGet": {"port": GRPC + 1}}, "liveness"),
    (SIDECAR + ["resources"], {}, "memory request and limit"),
    (NODE + ["resources", "requests"], {"memory": "1Gi"}, "cpu request"),
    (SIDECAR + ["securityContext"], {}, "non-root"),
    (NODE + ["lifecycle"], {}, "preStop"),
    (POD + ["terminationGracePeriodSeconds"], 10, "terminationGracePeriodSeconds"),
    (["spec", "serviceName"], "nope", "headless"),
    (POD + ["volumes", 0], {"name": "models", "persistentVolumeClaim": {"claimName": "nope"}},
     "PersistentVolumeClaim"),
])
def test_statefulset_check_can_fail(grace_s, path, value, why):
    objects = dict(OBJECTS)
    objects[STS] = manifests.mutated(OBJECTS[STS], path, value)
    problems = checks.check_k8s(objects, grace_s, EXTRA)
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("key, path, value, why", [
    (lambda: ("Service", headless()), ["spec", "clusterIP"], "10.0.0.1", "headless"),
    (client_service, ["spec", "selector"], {"app": "other"}, "does not select"),
    (client_service, ["spec", "ports", 0, "targetPort"], "nope", "does not reach"),
    (client_service, ["spec", "ports", 0, "port"], UNUSED, "not a tfscache port"),
])
def test_service_check_can_fail(grace_s, key, path, value, why):
    objects = dict(OBJECTS)
    objects[key()] = manifests.mutated(OBJECTS[key()], path, value)
    problems = checks.check_k8s(objects, grace_s, EXTRA)
    assert any(why in p for p in problems), problems


def test_missing_configmap_fails(grace_s):
    objects = {k: v for k, v in OBJECTS.items() if k[0] != "ConfigMap"}
    assert any("no ConfigMap" in p for p in checks.check_k8s(objects, grace_s, EXTRA))


# -- the pod around tfscache: locked down, probed, spread, budgeted (issue 14) ----------------

VARIANTS = ["", *manifests.K8S_VARIANTS]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_locks_down_probes_spreads_and_budgets_the_pods(variant, tmp_path):
    objects = manifests.load_k8s(variant)
    settings = pod_settings(tmp_path)[1]
    assert podchecks.check_security(objects[STS]) == []
    assert podchecks.check_tfserving_health(manifests.container(objects[STS], "tfserving")) == []
    assert podchecks.check_pdb(objects, settings.ring.replicas_per_model) == []
    assert podchecks.check_spread(objects[STS]) == []
    assert checks.check_k8s(objects, settings.server.grace_s, EXTRA) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_tfserving_exports_its_own_metrics_from_a_configmap(variant):
    pair = next(p for p in manifests.deployments()["k8s"] if p.name == ("k8s-" + variant if variant else "k8s"))
    assert podchecks.check_monitoring(pair) == []


def test_monitoring_check_can_fail():
    pair = manifests.deployments()["k8s"][0]
    flag = "--monitoring_config_file=/etc/tfserving/monitoring.config"
    without = dataclasses.replace(pair, tfserving_args=[a for a in pair.tfserving_args if a != flag])
    assert any("needs --monitoring_config_file" in p for p in podchecks.check_monitoring(without))
    moved = dataclasses.replace(pair, tfserving_args=[a.replace("/etc/tfserving/", "/etc/x/")
                                                      for a in pair.tfserving_args])
    assert any("not a mounted ConfigMap file" in p for p in podchecks.check_monitoring(moved))
    read = pair.extra["read"]
    off = dataclasses.replace(pair, extra={**pair.extra, "read": lambda m, path: read(m, path).replace("true",
                                                                                                       "false")})
    assert any("must enable prometheus_config" in p for p in podchecks.check_monitoring(off))


@pytest.mark.parametrize("path, value, why", [
    (NODE + ["securityContext", "readOnlyRootFilesystem"], False, "tfserving: readOnlyRootFilesystem"),
    (NODE + ["securityContext", "runAsUser"], 0, "tfserving: must run as non-root"),
    (SIDECAR + ["securityContext", "allowPrivilegeEscalation"], True, "tfscache: allowPrivilegeEscalation"),
    (SIDECAR + ["securityContext", "capabilities"], {"drop": ["NET_RAW"]}, "tfscache: capabilities"),
    (NODE + ["securityContext", "capabilities"], {"drop": ["ALL"], "add": ["SYS_PTRACE"]}, "tfserving: capab"),
])
def test_security_check_can_fail(path, value, why):
    problems = podchecks.check_security(manifests.mutated(OBJECTS[STS], path, value))
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("path, value, why", [
    (NODE + ["args"], ["--port=8510"], "--enable_grpc_healthcheck_service=true"),
    (NODE + ["livenessProbe"], {"tcpSocket": {"port": 8510}}, "livenessProbe"),
    (NODE + ["startupProbe", "grpc", "port"], 8511, "startupProbe"),
])
def test_tfserving_health_check_can_fail(path, value, why):
    node = manifests.container(manifests.mutated(OBJECTS[STS], path, value), "tfserving")
    problems = podchecks.check_tfserving_health(node)
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("change, why", [
    (lambda o: o.pop(("PodDisruptionBudget", "tfscache")), "found 0"),
    (lambda o: o[("PodDisruptionBudget", "tfscache")]["spec"].update(maxUnavailable=2), "at most"),
    (lambda o: o[("PodDisruptionBudget", "tfscache")]["spec"].update(selector={"matchLabels": {"a": "b"}}),
     "found 0"),
])
def test_pdb_check_can_fail(change, why):
    objects = copy.deepcopy(OBJECTS)
    change(objects)
    problems = podchecks.check_pdb(objects, 2)
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("key, value", [("whenUnsatisfiable", "ScheduleAnyway"), ("maxSkew", 2),
                                        ("topologyKey", "topology.kubernetes.io/zone")])
def test_spread_check_can_fail(key, value):
    sts = copy.deepcopy(OBJECTS[STS])
    for constraint in sts["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        if constraint["topologyKey"] == "kubernetes.io/hostname":
            constraint[key] = value
    assert podchecks.check_spread(sts)


def test_kustomization_check_can_fail(tmp_path):
    shutil.copytree(manifests.K8S, tmp_path / "k8s")
    assert checks.check_kustomization(tmp_path / "k8s") == []
    (tmp_path / "k8s" / "consul" / "stray.yaml").write_text("kind: ConfigMap\n")
    assert any("consul/kustomization.yaml" in p for p in checks.check_kustomization(tmp_path / "k8s"))


def test_overlays_render_as_kustomize_does():
    # The variants change only what they say: the consul one the sidecar's environment, the pvc one
    # the models volume; kustomize's JSON 6902 semantics (append with -, replace, remove) as RFC 6902.
    base, consul, pvc = (manifests.load_k8s(v) for v in ("", "consul", "pvc"))
    env = {e["name"] for e in manifests.container(consul[STS], "tfscache")["env"]}
    assert env - {e["name"] for e in manifests.container(base[STS], "tfscache")["env"]} == {
        "HOST_IP", "TFSCACHE_DISCOVERY_BACKEND", "TFSCACHE_DISCOVERY_CONSUL_ADDRESS"}
    assert set(pvc) - set(base) == {("PersistentVolumeClaim", "tfscache-models")}
    doc = {"a": [1, 2], "b": {"c": 1}}
    assert overlays.apply_ops(doc, [{"op": "add", "path": "/a/-", "value": 3},
                                    {"op": "add", "path": "/a/0", "value": 0},
                                    {"op": "replace", "path": "/b/c", "value": 2},
                                    {"op": "remove", "path": "/a/1"}]) == {"a": [0, 2, 3], "b": {"c": 2}}
    with pytest.raises(ValueError):
        overlays.apply_ops(doc, [{"op": "replace", "path": "/b/d", "value": 1}])
    with pytest.raises(ValueError, match="not rendered"):
        overlays.kustomization_data({"resources": [], "patchesStrategicMerge": []}, manifests.K8S)


@pytest.mark.parametrize("text, fields", [
    ('prometheus_config {\n  enable: true,\n  path: "/m"\n}\n', {"enable": "true", "path": "/m"}),
    ("prometheus_config { enable: false }", {"enable": "false"}),
    ("prometheus_config { enable: true } extra_config {}", None),
    ("prometheus_config { enable: true nested { a: 1 } }", None),
    ("prometheus_config { enable: true bogus }", None),
])
def test_monitoring_config_reader(text, fields):
    assert podchecks.monitoring_fields(text) == fields
