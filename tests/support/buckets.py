"""Helpers for `tfscache serve` over a bucket: upload model directories, start a serve whose
nodes load from a disk tier, predict with the official stubs, read the tier and the store's GET log.

    sizes = upload(bucket, base)                        # {key: bytes} under NAME/
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "1GiB") as serve:
        predict(serve, "addk_1", 1.0)                   # [2.0]
        in_tier(tier)                                   # {"addk_1:1"}: complete versions on disk
        gets(bucket, sizes, "addk_1")                   # {key: GETs of it so far}
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import start_serve
from support.requests import predict_request

MARKER = ".tfscache-complete"

# The bucket tests that run against every store with a test server here: s3:// (moto) and gs://
# (fake-gcs-server). az:// (Azurite) has its own (test_serve_bucket_backends.py).
on_each_store = pytest.mark.parametrize("bucket", ["s3", "gs"], indirect=True)


def upload(bucket, base: Path, name: str | None = None) -> dict[str, int]:
    """Every file of model directory ``base`` under ``NAME/`` in the bucket; {key: size}."""
    name = name or base.name
    sizes = {}
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        key = f"{name}/{path.relative_to(base).as_posix()}"
        bucket.put(key, path.read_bytes())
        sizes[key] = path.stat().st_size
    return sizes


def version_bytes(sizes: dict[str, int], name: str, version: int = 1) -> int:
    return sum(size for key, size in sizes.items() if key.startswith(f"{name}/{version}/"))


def serve_bucket(tmp_path, bucket, tier: Path, *args: str):
    return start_serve(tmp_path, bucket.url, "--disk-cache-dir", str(tier), "--metrics-port", "0",
                       *args, env=bucket.server.env)


def metrics_port(serve) -> int:
    return json.loads((serve.directory / "ports.json").read_text())["metrics"]


def predict(serve, name: str, x: float = 1.0, **kw) -> list[float]:
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return list(stub.Predict(predict_request(name, x, **kw), timeout=120).outputs["y"].float_val)


def predict_error(serve, name: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        predict(serve, name)
    return caught.value


def in_tier(tier: Path) -> set[str]:
    return {f"{p.parent.parent.name}:{p.parent.name}" for p in tier.glob(f"*/*/{MARKER}")}


def gets(bucket, sizes: dict[str, int], name: str) -> dict[str, int]:
    return {key: bucket.gets(key) for key in sizes if key.startswith(f"{name}/")}
