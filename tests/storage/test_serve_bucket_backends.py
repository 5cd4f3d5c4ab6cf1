"""A bucket repository for the other store and the other node kind (issue 13):

* az:// against Microsoft's Azurite (npm), with `tfscache node`;
* s3:// (moto) with `--backend triton`: a real tritonserver loads from the disk tier, its
  config.pbtxt copied beside the versions; the client is the official tritonclient;
* s3:// (moto) with `--backend mlserver`: a real MLServer loads a version's model-settings.json
  and model file from the disk tier.

gs:// (fake-gcs-server) runs the s3:// tests of test_serve_bucket.py marked ``on_each_store``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as tritongrpc
from support.serving import start_serve
from support import azure
from support.buckets import MARKER, in_tier, predict
from support.mlserver import MLSERVER, PYTHON, SKIP_REASON, mlserver_infer, serve_nodes
from support.mlserver import resident_models as mlserver_resident
from support.triton import oip_infer, resident_models, serve_triton_nodes

from support.models.mlserver import build_mlserver_models
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


def test_mlserver_loads_from_the_disk_tier(tmp_path, bucket):
    """s3:// with ``--backend mlserver``: MLServer finds the downloaded version's
    model-settings.json in the disk tier and loads it from there."""
    if MLSERVER is None:
        pytest.skip(SKIP_REASON)
    names = build_mlserver_models(tmp_path / "built", PYTHON, synthetic=2, classifier=False, xgboost=False)
    for name in names:
        for key, data in files_of(tmp_path / "built" / name, name).items():
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
            (tmp_path / "built" / "addk_2" / "1" / "model-settings.json").read_bytes()
        assert (tier / "addk_2" / "1" / MARKER).exists() and not (tier / "addk_1").exists()
