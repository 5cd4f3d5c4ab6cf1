"""TF Serving's own end-to-end tests (model_servers/tensorflow_model_server_test.py;
docs/upstream/tfserving.md, "Tests in `ms/tensorflow_model_server_test.py`"), run over the
network against a real ``tfscache node`` with the official tensorflow_serving stubs, plus
the PredictionService error texts that clients match on.

Two nodes serve the whole module: ``default`` started the way the upstream harness
starts it (``--model_name=default --model_base_path=.../half_plus_two_cpu``, one
version 00000123), and ``config_node`` started with a model config file listing
half_plus_two (123, 124), half_plus_three and the tf.saved_model.save models.
"""

from __future__ import annotations

import functools
import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support import fixtures
from support.node import model_config, start_node, wait_for_states
from support.process import started_together
from support.requests import predict_request, reload_request
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

RPC_TIMEOUT = 30.0
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, test_models):
    """[default_node, config_node], started (and stopped) at once."""
    # The upstream harness serves saved_model_half_plus_two_cpu: only version 00000123.
    base = tmp_path_factory.mktemp("cpu") / "half_plus_two_cpu"
    shutil.copytree(test_models / "half_plus_two" / "00000123", base / "00000123")
    config = model_config(
        {"half_plus_two": test_models / "half_plus_two",
         "half_plus_three": test_models / "half_plus_three",
         "tf2": test_models / "half_plus_two_tf2",
         "saved_model_save": test_models / "saved_model_save",
         "multiple_signatures": test_models / "saved_model_save_multiple_signatures"},
        half_plus_two="model_version_policy { all {} }")
    with started_together([
            functools.partial(start_node, tmp_path_factory.mktemp("default"), model_name="default",
                              model_base_path=str(base)),
            functools.partial(start_node, tmp_path_factory.mktemp("config"), config=config)]) as pair:
        yield pair


@pytest.fixture(scope="module")
def default_node(two_nodes):
    return two_nodes[0]


@pytest.fixture(scope="module")
def config_node(two_nodes):
    return two_nodes[1]


default = fixtures.stub_on("default_node")
configured = fixtures.stub_on("config_node")


def example(x: float) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[x]))}))


def spec_of(model_spec):
    return model_spec.name, model_spec.signature_name, model_spec.version.value


def verify_predict(stub, expected, *, model="default", signature=None, specify_output=True,
                   batch_input=False, version=123, input_value=2.0):
    """VerifyPredictRequest of tensorflow_model_server_test_base.py."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if signature is not None:
        request.model_spec.signature_name = signature
    shape = [1, 1] if batch_input else [1]
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([input_value], dtype=tf.float32, shape=shape))
    if specify_output:
        request.output_filter.append("y")
    response = stub.Predict(request, RPC_TIMEOUT)
    assert "y" in response.outputs
    y = response.outputs["y"]
    assert y.dtype == types_pb2.DT_FLOAT
    assert len(y.float_val) == 1
    assert y.float_val[0] == expected
    assert spec_of(response.model_spec) == (model, signature or "serving_default", version)
    return response


def rpc_error(call, request):
    with pytest.raises(grpc.RpcError) as info:
        call(request, RPC_TIMEOUT)
    return info.value.code(), info.value.details()


# -- the upstream tests, one by one --------------------------------------------------------


def test_wait_for_server_ready_probe(default):
    """WaitForServerReady: Predict on a missing model; ready when details contain 'Servable'."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "intentionally_missing_model"
    code, details = rpc_error(default.Predict, request)
    assert code == grpc.StatusCode.NOT_FOUND
    assert details == "Servable not found for request: Latest(intentionally_missing_model)"
    assert "Servable" in details


def test_get_model_status(default_node):
    channel = grpc.insecure_channel(default_node.grpc_target)
    with channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "default"
        response = stub.GetModelStatus(request, RPC_TIMEOUT)
    assert len(response.model_version_status) == 1
    status = response.model_version_status[0]
    assert status.version == 123
    assert status.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert status.status.error_code == 0


def test_get_model_metadata(default):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "default"
    request.metadata_field.append("signature_def")
    response = default.GetModelMetadata(request, RPC_TIMEOUT)
    assert response.model_spec.name == "default"
    assert response.model_spec.version.value == 123
    assert not response.model_spec.signature_name
    assert len(response.metadata) == 1
    assert "signature_def" in response.metadata
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    assert sorted(signature_map.signature_def) == [
        "classify_x2_to_y3", "classify_x_to_y", "regress_x2_to_y3", "regress_x_to_y",
        "regress_x_to_y2", "serving_default"]
    assert signature_map.signature_def["serving_default"].inputs["x"].name == "x:0"


@pytest.mark.parametrize("node, model", [("default", "default"), ("configured", "tf2")],
                         ids=["tf1", "tf2"])
def test_classify(request, node, model):
    stub = request.getfixturevalue(node)
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = model
    req.model_spec.signature_name = "classify_x_to_y"
    req.input.example_list.examples.add().CopyFrom(example(2.0))
    response = stub.Classify(req, RPC_TIMEOUT)
    assert len(response.result.classifications) == 1
    assert len(response.result.classifications[0].classes) == 1
    assert response.result.classifications[0].classes[0].score == 3.0
    assert spec_of(response.model_spec) == (model, "classify_x_to_y", 123)


@pytest.mark.parametrize("node, model", [("default", "default"), ("configured", "tf2")],
                         ids=["tf1", "tf2"])
def test_regress(request, node, model):
    stub = request.getfixturevalue(node)
    req = regression_pb2.RegressionRequest()
    req.model_spec.name = model
    req.model_spec.signature_name = "regress_x_to_y"
    req.input.example_list.examples.add().CopyFrom(example(2.0))
    response = stub.Regress(req, RPC_TIMEOUT)
    assert len(response.result.regressions) == 1
    assert response.result.regressions[0].value == 3.0
    assert spec_of(response.model_spec) == (model, "regress_x_to_y", 123)


@pytest.mark.parametrize("node, model", [("default", "default"), ("configured", "tf2")],
                         ids=["tf1", "tf2"])
def test_multi_inference(request, node, model):
    stub = request.getfixturevalue(node)
    req = inference_pb2.MultiInferenceRequest()
    for signature, method in (("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)):
        task = req.tasks.add()
        task.model_spec.name = model
        task.model_spec.signature_name = signature
        task.method_name = method
    req.input.example_list.examples.add().CopyFrom(example(2.0))
    response = stub.MultiInference(req, RPC_TIMEOUT)
    assert len(response.results) == 2
    assert response.results[0].regression_result.regressions[0].value == 3.0
    assert response.results[1].classification_result.classifications[0].classes[0].score == 3.0
    assert spec_of(response.results[0].model_spec) == (model, "regress_x_to_y", 123)
    assert spec_of(response.results[1].model_spec) == (model, "classify_x_to_y", 123)


@pytest.mark.parametrize("specify_output", [True, False])
def test_predict_saved_model(default, specify_output):
    verify_predict(default, 3.0, specify_output=specify_output)


def test_predict_explicit_default_signature(default):
    verify_predict(default, 3.0, signature="serving_default")


def test_predict_batch_input(default):
    response = verify_predict(default, 3.0, batch_input=True)
    assert [d.size for d in response.outputs["y"].tensor_shape.dim] == [1, 1]


def test_predict_scalar_input(default):
    """predict_impl_test: a scalar 2.0 gives a scalar 3.0."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(2.0, dtype=tf.float32))
    response = default.Predict(request, RPC_TIMEOUT)
    y = response.outputs["y"]
    assert (list(y.tensor_shape.dim), list(y.float_val)) == ([], [3.0])
    assert spec_of(response.model_spec) == ("default", "serving_default", 123)


def test_predict_on_regress_signature(default):
    """predict_impl_test: Predict runs regress_x2_to_y3 with input key 'inputs' -> 4."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.model_spec.signature_name = "regress_x2_to_y3"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([2.0], dtype=tf.float32, shape=[1]))
    response = default.Predict(request, RPC_TIMEOUT)
    assert list(response.outputs["outputs"].float_val) == [4.0]


@pytest.mark.parametrize("specify_output", [True, False])
def test_good_model_config(configured, specify_output):
    verify_predict(configured, 3.0, model="half_plus_two", version=124, specify_output=specify_output)
    verify_predict(configured, 4.0, model="half_plus_three", specify_output=specify_output)


def test_version_124_via_spec_and_123_too(configured):
    for version in (123, 124):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half_plus_two"
        request.model_spec.version.value = version
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([2.0], dtype=tf.float32, shape=[1]))
        response = configured.Predict(request, RPC_TIMEOUT)
        assert list(response.outputs["y"].float_val) == [3.0]
        assert response.model_spec.version.value == version


def test_predict_tf2(configured):
    verify_predict(configured, 3.0, model="tf2")
    verify_predict(configured, 3.0, model="tf2", batch_input=True)


def test_predict_tf2_signature_default(configured):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tf2"
    response = configured.Predict(request, RPC_TIMEOUT)
    assert list(response.outputs["y"].float_val) == [2.0]  # default x = [0.0]


def test_tf_saved_model_save(configured):
    verify_predict(configured, 12.0, model="saved_model_save", specify_output=False)


def test_tf_saved_model_save_multiple_signatures(configured):
    verify_predict(configured, 2.0, model="multiple_signatures", signature="custom_signature_key")
    verify_predict(configured, 1.0, model="multiple_signatures")


def test_concurrent_predicts(configured):
    """Many clients at once each get their own answer (the node runs them in parallel)."""
    import concurrent.futures

    def call(i):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half_plus_three"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([float(i)], dtype=tf.float32, shape=[1]))
        return configured.Predict(request, RPC_TIMEOUT).outputs["y"].float_val[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(64)))
    assert results == [0.5 * i + 3.0 for i in range(64)]


# -- the error texts clients match on, over the network -------------------------------------


@pytest.mark.parametrize("make_request, code, details", [
    (lambda: predict_pb2.PredictRequest(), grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec"),
    (lambda: predict_request("nope"), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Latest(nope)"),
    (lambda: predict_request(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION,
     'Serving signature key "nope" not found.'),
    (lambda: predict_request(inputs={}), grpc.StatusCode.INVALID_ARGUMENT,
     "input size does not match signature: 0!=1 len({}) != len({x}). Sent extra: {}. "
     "Missing but required: {x}."),
    (lambda: predict_request(inputs={"z": tf.make_tensor_proto([1.0])}),
     grpc.StatusCode.INVALID_ARGUMENT,
     "Signature input alias: x(feed name: x:0) not found in request and no default value "
     "provided. Inputs expected to be in the request {z}, or default input alias set: "),
    (lambda: predict_request(output_filter=["w"]), grpc.StatusCode.INVALID_ARGUMENT,
     "output tensor alias not found in signature: w Outputs expected to be in the set {y}."),
    (lambda: predict_request(inputs={"x": tf.make_tensor_proto([b"2"])}),
     grpc.StatusCode.INVALID_ARGUMENT, "Expects arg[0] to be float but string is provided"),
], ids=["missing-spec", "not-found", "signature", "input-size", "alias", "filter", "dtype"])
def test_predict_errors(configured, make_request, code, details):
    assert rpc_error(configured.Predict, make_request()) == (code, details)


def test_predict_version_not_found(configured):
    request = predict_request()
    request.model_spec.version.value = 7
    assert rpc_error(configured.Predict, request) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(half_plus_two, 7)")


def test_classify_and_regress_missing_signature_is_invalid_argument(configured):
    for call, req in ((configured.Classify, classification_pb2.ClassificationRequest()),
                      (configured.Regress, regression_pb2.RegressionRequest())):
        req.model_spec.name = "half_plus_two"
        req.model_spec.signature_name = "nope"
        req.input.example_list.examples.add().CopyFrom(example(2.0))
        assert rpc_error(call, req) == (
            grpc.StatusCode.INVALID_ARGUMENT, "No signature was found with the name: nope")
        req.input.Clear()
        req.model_spec.signature_name = "classify_x_to_y" if call == configured.Classify else "regress_x_to_y"
        assert rpc_error(call, req) == (grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")


def test_multi_inference_unsupported_method(configured):
    req = inference_pb2.MultiInferenceRequest()
    task = req.tasks.add()
    task.model_spec.name = "half_plus_two"
    task.method_name = "tensorflow/serving/predict"
    req.input.example_list.examples.add().CopyFrom(example(2.0))
    assert rpc_error(configured.MultiInference, req) == (
        grpc.StatusCode.UNIMPLEMENTED, "Unsupported signature method_name: tensorflow/serving/predict")


def test_get_model_metadata_errors(configured):
    req = get_model_metadata_pb2.GetModelMetadataRequest()
    assert rpc_error(configured.GetModelMetadata, req) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    req.model_spec.name = "half_plus_two"
    assert rpc_error(configured.GetModelMetadata, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "GetModelMetadataRequest must specify at least one metadata_field")
    req.metadata_field.append("bogus")
    assert rpc_error(configured.GetModelMetadata, req) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Metadata field bogus is not supported")


def test_held_request_is_released_and_the_deadline_bounds_the_session_run(
        tmp_path_factory, test_models):
    """The gate model holds a Predict inside the session until released. And the gRPC
    deadline becomes RunOptions.timeout_in_ms: a run stuck in the session is cancelled,
    so it releases its servable handle and the version can unload (a run the server did
    not cancel would hold the handle, and the version would never reach END)."""
    import concurrent.futures

    from support.models.tfserving import build_gate

    gate = build_gate(tmp_path_factory.mktemp("gate"))
    models = {"gate": gate, "half_plus_two": test_models / "half_plus_two"}
    with start_node(tmp_path_factory.mktemp("deadline"), config=model_config(models)) as node, \
            grpc.insecure_channel(node.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        held = predict_pb2.PredictRequest()
        held.model_spec.name = "gate"
        release = predict_pb2.PredictRequest()
        release.model_spec.name = "gate"
        release.model_spec.signature_name = "release"
        release.inputs["value"].CopyFrom(tf.make_tensor_proto(np.float32(5.0)))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(stub.Predict, held, RPC_TIMEOUT)
            assert stub.Predict(release, RPC_TIMEOUT).outputs["value"].float_val[0] == 5.0
            assert future.result(RPC_TIMEOUT).outputs["value"].float_val[0] == 5.0

        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(held, 0.5)  # nothing queued: blocks in the session until the deadline
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        model_stub = model_service_pb2_grpc.ModelServiceStub(channel)
        response = model_stub.HandleReloadConfigRequest(
            reload_request(model_config({"half_plus_two": models["half_plus_two"]})), RPC_TIMEOUT)
        assert response.status.error_code == 0
        wait_for_states(model_stub, "gate", {1: "END"}, timeout=30)
        verify_predict(stub, 3.0, model="half_plus_two", version=124)
