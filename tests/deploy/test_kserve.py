"""deploy/kserve/: ServingRuntimes and InferenceServices (tfscache in front of Triton / MLServer).

KServe cannot run on the build machines, so the manifests are parsed, not applied. The fields
KServe requires are checked against the ServingRuntime / InferenceService specs (kserve/kserve's
pkg/apis/serving/v1alpha1/servingruntime_types.go and config/runtimes/*.yaml); tfscache's args
are parsed with `tfscache serve`'s own parser and settings, so a flag that does not exist, or a
port that does not match the declared container ports, fails here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tfscache import settings as settings_mod
from tfscache.cli import serve

from .manifests import DEPLOY

KSERVE = DEPLOY / "kserve"
# Paths the OIP REST front end answers without naming a model (tfscache/frontend/protocols/oip).
HEALTH_PATHS = {"/v2/health/live", "/v2/health/ready"}
ENTRYPOINT_PREFIX = ["tfscache", "serve"]  # deploy/Dockerfile's ENTRYPOINT


def load() -> list[tuple[Path, dict]]:
    docs = []
    for path in sorted(KSERVE.glob("*.yaml")):
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


DOCS = load()
RUNTIMES = {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == "ServingRuntime"}
ISVCS = [d for _, d in DOCS if d["kind"] == "InferenceService"]


def tfscache_settings(args: list[str]):
    parsed = serve._parser().parse_args(args)
    return settings_mod.from_args(parsed, env={})


def test_every_manifest_is_a_kserve_object():
    assert len(RUNTIMES) == 2 and len(ISVCS) == 2
    for path, doc in DOCS:
        expected = {"ServingRuntime": "serving.kserve.io/v1alpha1",
                    "InferenceService": "serving.kserve.io/v1beta1"}
        assert doc["apiVersion"] == expected[doc["kind"]], path
        assert doc["metadata"]["name"], path


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_runtime_fields(name):
    spec = RUNTIMES[name]["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    for fmt in spec["supportedModelFormats"]:
        assert isinstance(fmt["name"], str) and isinstance(fmt["version"], str)
        assert isinstance(fmt["autoSelect"], bool)
    containers = spec["containers"]
    assert containers[0]["name"] == "kserve-container"  # the container KServe routes to
    for c in containers:
        assert c["image"] and (c.get("args") or c.get("command")), c["name"]
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_tfscache_args_and_ports(name):
    c = RUNTIMES[name]["spec"]["containers"][0]
    s = tfscache_settings(c["args"] + ["--model-repository=s3://bucket/models"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http1": s.server.rest_port, "h2c": s.server.grpc_port}
    backend = s.node.backend
    assert name == f"tfscache-{backend}"
    # The second container is the model server that --node-address names.
    node = RUNTIMES[name]["spec"]["containers"][1]
    host, _, rest = s.node.node_address.partition(":")
    grpc_port, _, http_port = rest.partition(",")
    assert host == "127.0.0.1"
    text = shlex.join(node.get("command", []) + node.get("args", []))
    text += " " + " ".join(f"{e['name']}={e['value']}" for e in node.get("env", []))
    assert f"{grpc_port}" in text and f"{http_port}" in text, text
    assert s.storage.cache_dir in text  # the model server reads tfscache's disk tier
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in HEALTH_PATHS
        assert get["port"] in ports.values() or get["port"] in ports


def test_a_flag_tfscache_lacks_fails_the_parser():
    with pytest.raises(SystemExit):
        tfscache_settings(["--no-such-flag=1"])


@pytest.mark.parametrize("isvc", ISVCS, ids=lambda d: d["metadata"]["name"])
def test_inference_service(isvc):
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    model = isvc["spec"]["predictor"]["model"]
    runtime = RUNTIMES[model["runtime"]]["spec"]
    formats = {(f["name"], f["version"]) for f in runtime["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in runtime["protocolVersions"]
    uri = model["storageUri"]
    assert urlparse(uri).scheme in {"s3", "gs"}
    # tfscache's repository is the same bucket (the model's args join the runtime's).
    args = runtime["containers"][0]["args"] + model["args"]
    s = tfscache_settings(args)
    assert s.model_repository == uri
    assert model["resources"]["requests"] and model["resources"]["limits"]
