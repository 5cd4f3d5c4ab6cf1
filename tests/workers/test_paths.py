"""What a request meets through `tfscache serve --workers 2` is what it meets in one process: warm
and cold TF Serving gRPC and REST, status probes (answered without a load), version labels, TF
Serving's error texts for unknown models and versions, and health on the public gRPC port."""

from __future__ import annotations

import json

import grpc
import pytest
import requests
from support.serving import link_repository, start_serve
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.requests import predict_request, status_request
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from workers.conftest import worker_pids

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE


@pytest.fixture(scope="module")
def serve(synthetic_models, tmp_path_factory):
    labelled = synthetic_models([5], versions=(1, 2))[0]  # a build of its own: its labels.json is ours
    (labelled / "labels.json").write_text(json.dumps({"stable": 1, "canary": 2}))
    repo = link_repository(tmp_path_factory.mktemp("paths") / "models", [labelled, *synthetic_models(3)])
    with start_serve(tmp_path_factory.mktemp("paths-serve"), repo, "--workers", "2", "--local-nodes", "1") as serve:
        yield serve


@pytest.fixture(scope="module")
def channel(serve):
    with grpc.insecure_channel(serve.grpc_target) as channel:
        yield channel


def y(reply) -> list[float]:
    return list(reply.outputs["y"].float_val)


def test_two_workers_serve_cold_and_warm_grpc_and_rest(serve, channel):
    assert len(worker_pids(serve.pid)) == 2
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for x in range(30):
        assert y(stub.Predict(predict_request("addk_1", float(x)), timeout=60)) == [x + 1.0]
    for x in range(30):
        reply = requests.post(f"{serve.rest_url}/v1/models/addk_2:predict", json={"instances": [x]}, timeout=60)
        assert (reply.status_code, reply.json()) == (200, {"predictions": [x + 2.0]})
    serve.wait_for_log("delegated model addk_1 version 1")  # the warm path was taken
    serve.wait_for_log("delegated model addk_2 version 1")


def test_health_on_the_public_port_is_serving(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService"),
                        timeout=10).status == health_pb2.HealthCheckResponse.SERVING


def test_a_status_probe_loads_nothing(serve, channel):
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    reply = models.GetModelStatus(status_request("addk_3"), timeout=30)
    assert [(s.version, s.state) for s in reply.model_version_status] == [(1, AVAILABLE)]
    assert "loaded addk_3" not in serve.log_text()


def test_version_labels_resolve_in_the_worker(serve, channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for label, version in (("stable", 1), ("canary", 2)):
        reply = stub.Predict(predict_request("addk_5", 1.0, label=label), timeout=60)
        assert (y(reply), reply.model_spec.version.value) == ([6.0], version)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("addk_5", 1.0, label="nope"), timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope")
    reply = requests.post(f"{serve.rest_url}/v1/models/addk_5/labels/canary:predict", json={"instances": [1.0]},
                          timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"predictions": [6.0]})


def test_unknown_models_and_versions_get_tf_servings_texts(serve, channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for request, text in ((predict_request("nope"), "Servable not found for request: Latest(nope)"),
                          (predict_request("addk_1", version=7), "Servable not found for request: Specific(addk_1, 7)")):
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=60)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, text)
    reply = requests.get(f"{serve.rest_url}/v1/models/nope", timeout=60)
    assert (reply.status_code, reply.json()) == (404, {"error": "Could not find any versions of model nope"})
