"""deploy/k8s/: the StatefulSet (TF Serving + sidecar, one PID namespace), Services, ConfigMaps."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from . import checks, manifests

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
