"""deploy/k8s/keda/: the ScaledObject scales the StatefulSet on metrics tfscache exports, at the config's caps."""

from __future__ import annotations

import re

import yaml
from prometheus_client import generate_latest

from support.fakecache import FakeCache
from tfscache.observe.metrics import Metrics, NodeView

from . import manifests
from .test_k8s import OBJECTS, STS, pod_settings

KEDA = manifests.K8S / "keda"
SCALED = yaml.safe_load((KEDA / "scaledobject.yaml").read_text())


def exported() -> set[str]:
    metrics = Metrics()
    metrics.watch(lambda: [NodeView("node0", FakeCache(), True)], lambda: 1)
    text = generate_latest(metrics.registry).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def triggers() -> dict[str, dict]:
    """The prometheus triggers by the metric their query sums."""
    found = {}
    for trigger in SCALED["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        names = re.findall(r"tfscache_[a-z_]+", trigger["metadata"]["query"])
        assert len(names) == 1, trigger
        found[names[0]] = trigger
    return found


def test_the_scaled_object_targets_the_statefulset_and_the_overlay_applies_the_base():
    assert SCALED["kind"] == "ScaledObject" and SCALED["apiVersion"] == "keda.sh/v1alpha1"
    target = SCALED["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == STS and STS in OBJECTS
    assert yaml.safe_load((KEDA / "kustomization.yaml").read_text())["resources"] == ["../base", "scaledobject.yaml"]
    assert manifests.load_k8s("keda")[("ScaledObject", "tfscache")] == SCALED
    assert 1 <= SCALED["spec"]["minReplicaCount"] <= SCALED["spec"]["maxReplicaCount"]


def test_every_query_reads_a_metric_tfscache_exports():
    assert set(triggers()) <= exported()
    assert {"tfscache_unloads_per_minute", "tfscache_resident_models", "tfscache_resident_bytes"} == set(triggers())


def test_thresholds_restate_the_configs_caps_and_scale_settings(tmp_path):
    settings = pod_settings(tmp_path)[1]
    share = 1.0 - settings.scale.headroom
    by_metric = triggers()
    assert all(t["metricType"] == "AverageValue" for t in by_metric.values())  # pods = ceil(sum / threshold)
    threshold = {name: float(t["metadata"]["threshold"]) for name, t in by_metric.items()}
    assert threshold["tfscache_unloads_per_minute"] == settings.scale.unloads_per_minute_high
    assert threshold["tfscache_resident_models"] == int(share * settings.cache.max_models_per_node)
    assert threshold["tfscache_resident_bytes"] == int(share * settings.cache.memory_per_node)
    for name in ("tfscache_resident_models", "tfscache_resident_bytes"):  # leaving versions do not count
        assert 'state!="unloading"' in by_metric[name]["metadata"]["query"]
