"""The gRPC adapter: malformed bytes, the reload envelope, the one error mapper."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest
from support.node import wait_for_states
from support.requests import reload_request, status_request
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tfscache.errors import NotFound
from tfscache.modelserver.grpc_api import build_server

METHODS = {  # method -> request message
    "/tensorflow.serving.PredictionService/Predict": "PredictRequest",
    "/tensorflow.serving.PredictionService/Classify": "ClassificationRequest",
    "/tensorflow.serving.PredictionService/Regress": "RegressionRequest",
    "/tensorflow.serving.PredictionService/MultiInference": "MultiInferenceRequest",
    "/tensorflow.serving.PredictionService/GetModelMetadata": "GetModelMetadataRequest",
    "/tensorflow.serving.ModelService/GetModelStatus": "GetModelStatusRequest",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest": "ReloadConfigRequest",
}
GARBAGE = b"\xff\xff\xff\xff not a protobuf"
UNSUPPORTED = ("ServerModelConfig type not supported by HandleReloadConfigRequest. "
               "Only ModelConfigList is currently supported")


@pytest.fixture(scope="module")
def node(half_plus_two_node):
    """The session's half_plus_two node (tests/modelserver/conftest.py): these tests leave it as they found it."""
    return half_plus_two_node


@pytest.fixture(scope="module")
def channel(node):
    with grpc.insecure_channel(node.grpc_target) as channel:
        yield channel


def _predict(channel, name="half_plus_two"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].dtype = 1  # DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add(size=1)
    return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.rsplit("/", 1)[1])
def test_malformed_bytes_get_invalid_argument_and_the_node_keeps_serving(channel, method):
    call = channel.unary_unary(method)  # no serialisers: raw bytes on the wire
    with pytest.raises(grpc.RpcError) as info:
        call(GARBAGE, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(
        f"Could not parse the request as tensorflow.serving.{METHODS[method]}: ")
    assert _predict(channel).outputs["y"].float_val == [3.0]


def test_empty_bytes_are_a_default_request(channel):
    call = channel.unary_unary("/tensorflow.serving.ModelService/GetModelStatus")
    with pytest.raises(grpc.RpcError) as info:
        call(b"", timeout=10)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")


@pytest.mark.parametrize("request_", [
    model_management_pb2.ReloadConfigRequest(),
    reload_request('custom_model_config { type_url: "x" }'),
], ids=["unset", "custom"])
def test_reload_accepts_only_model_config_list(channel, request_):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.HandleReloadConfigRequest(request_, timeout=10)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, UNSUPPORTED)
    wait_for_states(stub, "half_plus_two", {124: "AVAILABLE"}, timeout=5)


def test_unknown_model_is_servable_not_found(channel):
    with pytest.raises(grpc.RpcError) as info:
        _predict(channel, "intentionally_missing_model")
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(intentionally_missing_model)")


def test_successful_reload_response_has_ok_status(channel, test_models):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    config = (f'model_config_list {{ config {{ name: "half_plus_two" '
              f'base_path: "{test_models / "half_plus_two"}" model_platform: "tensorflow" }} }}')
    response = stub.HandleReloadConfigRequest(reload_request(config), timeout=30)
    assert response.HasField("status") and response.status.error_code == 0


class _Core:
    """Stands in for ServingCore to drive the error mapper; not a model server."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def status(self, request):
        raise self.error


@pytest.mark.parametrize("error, code, details", [
    (RuntimeError("secret internals"), grpc.StatusCode.INTERNAL,
     "Internal error in the model server; see its log"),
    (NotFound("x" * 1100), grpc.StatusCode.NOT_FOUND, "x" * 1024 + "...TRUNCATED"),
], ids=["unexpected", "truncated"])
async def test_error_mapper(error, code, details, caplog):
    executor = concurrent.futures.ThreadPoolExecutor(2)
    server = build_server(_Core(error), executor)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetModelStatus(status_request("m"), timeout=10)
    finally:
        await server.stop(None)
        executor.shutdown()
    assert (info.value.code(), info.value.details()) == (code, details)
    if isinstance(error, RuntimeError):
        assert "secret internals" in caplog.text  # logged with its traceback, not sent
