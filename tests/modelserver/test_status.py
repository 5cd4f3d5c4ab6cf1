"""ModelService.GetModelStatus against a real node (docs/upstream/tfserving.md,
"ModelService.GetModelStatus")."""

from __future__ import annotations

import grpc
import pytest
from support.node import model_config, start_node, wait_for_states
from support.requests import predict_request, status_request
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

State = get_model_status_pb2.ModelVersionStatus.State


@pytest.fixture(scope="module")
def node(tmp_path_factory, test_models):
    config = model_config({"two": test_models / "half_plus_two", "three": test_models / "half_plus_three"},
                          two="model_version_policy { all {} }")
    with start_node(tmp_path_factory.mktemp("status"), config=config) as node:
        yield node


@pytest.fixture(scope="module")
def stub(node):
    with grpc.insecure_channel(node.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        wait_for_states(stub, "two", {123: "AVAILABLE", 124: "AVAILABLE"})
        yield stub


def test_all_versions_ascending_with_ok_status(stub):
    response = stub.GetModelStatus(status_request("two"), timeout=10)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (123, State.AVAILABLE), (124, State.AVAILABLE)]
    for entry in response.model_version_status:
        assert entry.HasField("status")
        assert (entry.status.error_code, entry.status.error_message) == (0, "")


def test_specific_version(stub):
    response = stub.GetModelStatus(status_request("two", version=123), timeout=10)
    assert [(s.version, s.state) for s in response.model_version_status] == [(123, State.AVAILABLE)]


def test_version_label_is_ignored_even_when_unknown(stub):
    response = stub.GetModelStatus(status_request("two", label="no-such-label"), timeout=10)
    assert [s.version for s in response.model_version_status] == [123, 124]


@pytest.mark.parametrize("request_, code, message", [
    (get_model_status_pb2.GetModelStatusRequest(), grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec"),
    (status_request("two", version=7), grpc.StatusCode.NOT_FOUND, "Could not find version 7 of model two"),
    (status_request("nope"), grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope"),
    (status_request(""), grpc.StatusCode.NOT_FOUND, "Could not find any versions of model "),
    (status_request("nope", version=1), grpc.StatusCode.NOT_FOUND, "Could not find version 1 of model nope"),
], ids=["missing-spec", "unknown-version", "unknown-model", "empty-name", "unknown-model-version"])
def test_errors(stub, request_, code, message):
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelStatus(request_, timeout=10)
    assert (info.value.code(), info.value.details()) == (code, message)


def test_latest_policy_lists_only_the_loaded_version(stub):
    response = stub.GetModelStatus(status_request("three"), timeout=10)
    assert [(s.version, s.state) for s in response.model_version_status] == [(123, State.AVAILABLE)]


def test_long_messages_are_truncated_like_tf_serving(node):
    # A model name cannot be that long any more (255 bytes at most); a signature name can.
    signature = "s" * 2000
    with grpc.insecure_channel(node.grpc_target) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            predict.Predict(predict_request("two", 1.0, signature=signature), timeout=10)
    expected = f'Serving signature key "{signature}" not found.'[:1024] + "...TRUNCATED"
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, expected)
