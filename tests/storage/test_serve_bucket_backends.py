"""A bucket repository for the other store and the other node kind (issue 13):

* az:// against Microsoft's Azurite (npm), with `tfscache node`;
* s3:// (moto) with `--backend triton`: a real tritonserver loads from the disk tier, its
  config.pbtxt copied beside the versions; the client is the official tritonclient;
* s3:// (moto) with `--backend mlserver`: a real MLServer loads a version's model-settings.json
  and model file from the disk tier; and models in MLServer's own (flat) layout beside a versioned
  one, each flat model downloaded into the tier's NAME/ and evicted from it by bytes like a version.

gs:// (fake-gcs-server) runs the s3:// tests of test_serve_bucket.py marked ``on_each_store``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as tritongrpc
from support.serving import start_serve
from support import azure
from support.buckets import MARKER, in_tier, predict
from support.mlserver import MLSERVER, PYTHON, SKIP_REASON, mlserver_infer, serve_nodes
from support.mlserver import resident_models as mlserver_resident
from support.triton import oip_infer, resident_models, serve_triton_nodes

from support.models.mlserver import SKLEARN, build_mlserver_models
from support.models.triton import build_triton_models

azurite = azure.azurite


def files_of(base: Path, name: str) -> dict[str, bytes]:
    return {f"{name}/{p.relative_to(base).as_posix()}": p.read_bytes()
            for p in sorted(base.rglob("*")) if p.is_file()}


def test_lazy_load_from_azure_through_serve(tmp_path, azurite, synthetic_models):
    base = synthetic_models([1])[0]
    azurite.upload({f"models/{key}": data for key, data in files_of(base, "addk_1").items()})
    tier = tmp_path / "tier"
    env = {name: azurite.env[name] for name in
           ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT")}
    with start_serve(tmp_path, f"az://{azurite.container}/models", "--disk-cache-dir", str(tier),
                     "--disk-cache-bytes", "100MiB", env=env) as serve:
        assert predict(serve, "addk_1", 1.0) == [2.0]
        assert in_tier(tier) == {"addk_1:1"}


def test_triton_loads_from_the_disk_tier(tmp_path, bucket):
    built = build_triton_models(tmp_path / "built", synthetic=2)
    for name, base in built.items():
        for key, data in files_of(base, name).items():
            bucket.put(key, data)
    tier = tmp_path / "tier"
    with start_serve(tmp_path, bucket.url, "--backend", "triton", "--local-nodes", "1",
                     "--disk-cache-dir", str(tier), "--disk-cache-bytes", "100MiB",
                     env=bucket.server.env) as serve:
        node = f"127.0.0.1:{serve_triton_nodes(serve)['node0']['grpc']}"
        assert oip_infer(serve.grpc_target, "addk_2", 1.0) == [3.0]
        assert resident_models(node) == {"addk_2"}
        assert (tier / "addk_2" / "config.pbtxt").read_bytes() == (built["addk_2"] / "config.pbtxt").read_bytes()
        assert (tier / "addk_2" / "1" / MARKER).exists() and not (tier / "addk_1").exists()


@pytest.fixture(scope="module")
def mlserver_built(tmp_path_factory) -> Path:
    """``addk_1`` .. ``addk_3`` in the versioned layout (``NAME/1/``), trained once here."""
    if MLSERVER is None:
        pytest.skip(SKIP_REASON)
    built = tmp_path_factory.mktemp("mlserver-built")
    build_mlserver_models(built, PYTHON, synthetic=3, classifier=False, xgboost=False)
    return built


def test_mlserver_loads_from_the_disk_tier(tmp_path, bucket, mlserver_built):
    """s3:// with ``--backend mlserver``: MLServer finds the downloaded version's
    model-settings.json in the disk tier and loads it from there."""
    for name in ("addk_1", "addk_2"):
        for key, data in files_of(mlserver_built / name, name).items():
            bucket.put(key, data)
    tier = tmp_path / "tier"
    with start_serve(tmp_path, bucket.url, "--backend", "mlserver", "--node-command", str(MLSERVER),
                     "--local-nodes", "1", "--disk-cache-dir", str(tier), "--disk-cache-bytes", "100MiB",
                     env=bucket.server.env) as serve:
        node = f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"
        client = tritongrpc.InferenceServerClient(serve.grpc_target)
        try:
            assert mlserver_infer(tritongrpc, client, "addk_2", 1.0) == [3.0]
        finally:
            client.close()
        assert mlserver_resident(node) == {"addk_2"}
        assert (tier / "addk_2" / "1" / "model-settings.json").read_bytes() == \
            (mlserver_built / "addk_2" / "1" / "model-settings.json").read_bytes()
        assert (tier / "addk_2" / "1" / MARKER).exists() and not (tier / "addk_1").exists()


BODY = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}


def flat_files(built: Path, name: str, version: str | None) -> dict[str, bytes]:
    """Model ``name`` (built as ``NAME/1/``) in MLServer's own layout: NAME/model-settings.json."""
    parameters = {"uri": "./model.joblib"} | ({"version": version} if version else {})
    return {f"{name}/model-settings.json": json.dumps(
                {"implementation": SKLEARN, "parameters": parameters}).encode(),
            f"{name}/model.joblib": (built / name / "1" / "model.joblib").read_bytes()}


def test_mlserver_serves_flat_models_from_the_disk_tier(tmp_path, bucket, mlserver_built):
    """A mixed bucket: ``addk_1`` flat with version "v1", ``addk_3`` flat with none, ``addk_2``
    versioned. The tier holds two of the three (by bytes); the node one model."""
    built = mlserver_built
    uploaded = flat_files(built, "addk_1", "v1") | flat_files(built, "addk_3", None) | files_of(
        built / "addk_2", "addk_2")
    for key, data in uploaded.items():
        bucket.put(key, data)
    sizes = {name: sum(len(d) for k, d in uploaded.items() if k.startswith(f"{name}/"))
             for name in ("addk_1", "addk_2", "addk_3")}
    tier = tmp_path / "tier"
    with start_serve(tmp_path, bucket.url, "--backend", "mlserver", "--node-command", str(MLSERVER),
                     "--local-nodes", "1", "--max-models-per-node", "1", "--disk-cache-dir",
                     str(tier), "--disk-cache-bytes", str(sum(sizes.values()) - 1),
                     env=bucket.server.env) as serve:
        node = f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"
        client = tritongrpc.InferenceServerClient(serve.grpc_target)
        try:
            wrong = requests.post(f"{serve.rest_url}/v2/models/addk_1/versions/v2/infer",
                                  json=BODY, timeout=60)  # resolved from the settings file alone
            assert (wrong.status_code, wrong.json()) == (
                404, {"error": "Model addk_1 with version v2 not found"})
            assert flat_in_tier(tier) == set() and bucket.gets("addk_1/model.joblib") == 0
            assert mlserver_infer(tritongrpc, client, "addk_1", 1.0, version="v1") == [2.0]
            assert mlserver_resident(node) == {"addk_1"}
            assert flat_in_tier(tier) == {"addk_1"} and in_tier(tier) == set()
            assert (tier / "addk_1" / "model-settings.json").read_bytes() == \
                uploaded["addk_1/model-settings.json"]
            assert mlserver_infer(tritongrpc, client, "addk_2", 1.0) == [3.0]  # versioned
            assert in_tier(tier) == {"addk_2:1"}
            reply = requests.post(f"{serve.rest_url}/v2/models/addk_3/infer", json=BODY,
                                  timeout=120)
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"] == [4.0]
            # No room for all three: the least recently used, flat addk_1, left the tier whole.
            assert (flat_in_tier(tier), in_tier(tier)) == ({"addk_3"}, {"addk_2:1"})
            assert not (tier / "addk_1").exists()
            assert mlserver_infer(tritongrpc, client, "addk_1", 1.0) == [2.0]  # no version: v1
            assert bucket.gets("addk_1/model.joblib") == 2
            assert mlserver_resident(node) == {"addk_1"}
        finally:
            client.close()


def flat_in_tier(tier: Path) -> set[str]:
    """The flat models the tier holds complete: ROOT/NAME/ with its marker."""
    return {p.parent.name for p in tier.glob(f"*/{MARKER}")}
