"""`tfscache serve --local-nodes 2` end to end, with unmodified tensorflow_serving clients.

TF Serving's own end-to-end cases (docs/upstream/tfserving.md,
"Tests in `ms/tensorflow_model_server_test.py`") run through the front
end on both protocols; every model is loaded lazily by the first request for it.
"""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import psutil
import pytest
import requests
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (classification_pb2, get_model_status_pb2, model_management_pb2,
                                     model_service_pb2_grpc, predict_pb2, regression_pb2)

from support.serving import start_serve
from support import fixtures
from support.requests import (example_request, float_tensor, metadata_request, predict_request,
                              regress_and_classify_request)
from tfscache.cluster.ring import Ring

MAX_RECEIVE = 4 << 20  # a small limit so the over-size case sends only a few MiB


@pytest.fixture(scope="module")
def serve(frontend_repo, tmp_path_factory):
    with start_serve(tmp_path_factory.mktemp("embedded"), frontend_repo, "--local-nodes", "2",
                     "--max-receive-message-size", str(MAX_RECEIVE)) as process:
        yield process


channel = fixtures.channel_to("serve")
stub = fixtures.prediction_stub
model_stub = fixtures.model_stub


def assert_spec(spec, name, signature, version):
    assert (spec.name, spec.signature_name, spec.version.value) == (name, signature, version)


# -- TF Serving's end-to-end cases, gRPC ------------------------------------------------


def test_predict(stub):
    for output_filter in ((), ("y",)):
        response = stub.Predict(predict_request("half_plus_two", output_filter=output_filter), timeout=60)
        assert response.outputs["y"].dtype == types_pb2.DT_FLOAT
        assert list(response.outputs["y"].float_val) == [3.0]
        assert_spec(response.model_spec, "half_plus_two", "serving_default", 124)


def test_predict_specific_version_and_other_models(stub):
    response = stub.Predict(predict_request("half_plus_two", version=123), timeout=60)
    assert_spec(response.model_spec, "half_plus_two", "serving_default", 123)
    response = stub.Predict(predict_request("half_plus_three", output_filter=["y"]), timeout=60)
    assert list(response.outputs["y"].float_val) == [4.0]
    response = stub.Predict(predict_request("saved_model_save"), timeout=60)
    assert list(response.outputs["y"].float_val) == [12.0]
    multiple = "saved_model_save_multiple_signatures"
    assert list(stub.Predict(predict_request(multiple), timeout=60).outputs["y"].float_val) == [1.0]
    response = stub.Predict(predict_request(multiple, signature="custom_signature_key"), timeout=60)
    assert list(response.outputs["y"].float_val) == [2.0]


def test_get_model_status(model_stub):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.version.value = 124
    response = model_stub.GetModelStatus(request, timeout=60)
    assert len(response.model_version_status) == 1
    status = response.model_version_status[0]
    assert (status.version, status.state, status.status.error_code) == (124, 30, 0)


def test_get_model_metadata(stub):
    response = stub.GetModelMetadata(metadata_request("half_plus_two"), timeout=60)
    assert (response.model_spec.name, response.model_spec.version.value) == ("half_plus_two", 124)
    assert list(response.metadata) == ["signature_def"]


def test_classify(stub):
    request = example_request(classification_pb2.ClassificationRequest, "half_plus_two", "classify_x_to_y")
    response = stub.Classify(request, timeout=60)
    assert len(response.result.classifications) == 1
    assert [c.score for c in response.result.classifications[0].classes] == [3.0]
    assert_spec(response.model_spec, "half_plus_two", "classify_x_to_y", 124)


def test_regress(stub):
    request = example_request(regression_pb2.RegressionRequest, "half_plus_two", "regress_x_to_y")
    response = stub.Regress(request, timeout=60)
    assert [r.value for r in response.result.regressions] == [3.0]
    assert_spec(response.model_spec, "half_plus_two", "regress_x_to_y", 124)


def test_multi_inference(stub):
    response = stub.MultiInference(regress_and_classify_request("half_plus_two"), timeout=60)
    assert len(response.results) == 2
    assert [r.value for r in response.results[0].regression_result.regressions] == [3.0]
    assert response.results[1].classification_result.classifications[0].classes[0].score == 3.0
    assert_spec(response.results[0].model_spec, "half_plus_two", "regress_x_to_y", 124)
    assert_spec(response.results[1].model_spec, "half_plus_two", "classify_x_to_y", 124)


# -- TF Serving's end-to-end cases, REST ------------------------------------------------


def test_rest_predict_row_and_columnar(serve):
    reply = requests.post(f"{serve.rest_url}/v1/models/half_plus_two:predict",
                          json={"instances": [2.0, 3.0, 4.0]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"predictions": [3.0, 3.5, 4.0]})
    assert reply.headers["Content-Type"].startswith("application/json")
    reply = requests.post(f"{serve.rest_url}/v1/models/half_plus_two/versions/123:predict",
                          json={"inputs": [2.0, 3.0, 4.0]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"outputs": [3.0, 3.5, 4.0]})


def test_rest_classify_and_regress(serve):
    reply = requests.post(f"{serve.rest_url}/v1/models/half_plus_two:classify",
                          json={"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}, timeout=60)
    assert reply.json() == {"results": [[["", 3.0]]]}
    reply = requests.post(f"{serve.rest_url}/v1/models/half_plus_two:regress",
                          json={"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}, timeout=60)
    assert reply.json() == {"results": [3.0]}


def test_rest_status_and_metadata(serve):
    reply = requests.get(f"{serve.rest_url}/v1/models/half_plus_three", timeout=60)
    assert reply.status_code == 200
    assert json.loads(reply.text) == {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    reply = requests.get(f"{serve.rest_url}/v1/models/half_plus_two/versions/124/metadata", timeout=60)
    body = reply.json()
    assert body["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "124"}
    assert "serving_default" in body["metadata"]["signature_def"]["signature_def"]


def test_rest_errors(serve):
    url = serve.rest_url
    reply = requests.post(f"{url}/v1/models/nope:predict", json={"instances": [1.0]}, timeout=60)
    assert (reply.status_code, reply.json()) == (404, {"error": "Servable not found for request: Latest(nope)"})
    reply = requests.post(f"{url}/v1/models/half_plus_two/versions/999:predict", json={"instances": [1.0]},
                          timeout=60)
    assert (reply.status_code, reply.json()) == (
        404, {"error": "Servable not found for request: Specific(half_plus_two, 999)"})
    reply = requests.post(f"{url}/v1/models/half_plus_two:PREDICT", json={}, timeout=60)
    assert (reply.status_code, reply.json()) == (
        400, {"error": "Malformed request: POST /v1/models/half_plus_two:PREDICT"})
    # A node's own error passes through: JSON checks run on the node.
    reply = requests.post(f"{url}/v1/models/half_plus_two:predict", data=b"{", timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].startswith("JSON Parse error")
    # As in TF Serving the body is parsed before the model is looked up: bad JSON is 400 for an
    # unknown model or version too, and JSON that names no inputs is still NOT_FOUND.
    for path in ("nope:predict", "nope:classify", "half_plus_two/versions/999:regress"):
        reply = requests.post(f"{url}/v1/models/{path}", data=b"", timeout=60)
        assert (reply.status_code, reply.json()) == (400, {"error": "JSON Parse error: The document is empty"}), path
    reply = requests.post(f"{url}/v1/models/nope:predict", data=b"[1", timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].startswith("JSON Parse error: "), reply.text
    reply = requests.post(f"{url}/v1/models/nope:predict", data=b"{}", timeout=60)
    assert (reply.status_code, reply.json()) == (404, {"error": "Servable not found for request: Latest(nope)"})
    assert requests.get(f"{url}/healthz", timeout=60).status_code == 404


@pytest.mark.parametrize("name", ["..", ".", "../half_plus_two", "a/b", "a\x00b"])
def test_unsafe_names_on_both_protocols(stub, serve, name):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request(name), timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"Invalid model name {name!r}")
    quoted = requests.utils.quote(name, safe="")
    reply = requests.post(f"{serve.rest_url}/v1/models/{quoted}:predict", json={"instances": [1.0]}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"].startswith(f"Invalid model name {name!r}")


# -- errors --------------------------------------------------------------------------


def test_unknown_model_and_version(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("nope"), timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("half_plus_two", version=7), timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(half_plus_two, 7)")


def test_status_of_unknown_model_has_get_model_status_texts(model_stub, serve):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as info:
        model_stub.GetModelStatus(request, timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope")
    request.model_spec.name = "half_plus_two"
    request.model_spec.version.value = 5
    with pytest.raises(grpc.RpcError) as info:
        model_stub.GetModelStatus(request, timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Could not find version 5 of model half_plus_two")
    reply = requests.get(f"{serve.rest_url}/v1/models/nope", timeout=60)
    assert (reply.status_code, reply.json()) == (404, {"error": "Could not find any versions of model nope"})


def test_missing_spec_and_name_get_tf_servings_errors(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_pb2.PredictRequest(), timeout=60)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request(""), timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")


def test_node_error_passes_through(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("half_plus_two", signature="nope"), timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.')


def test_reload_config_is_refused(model_stub):
    request = model_management_pb2.ReloadConfigRequest()
    request.config.model_config_list.config.add(name="m", base_path="/m", model_platform="tensorflow")
    with pytest.raises(grpc.RpcError) as info:
        model_stub.HandleReloadConfigRequest(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "tfscache manages the model configs of its nodes" in info.value.details()


def test_malformed_bytes_and_unknown_method_then_still_serving(channel, stub):
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\x0a\xff\xff\xff\x0f", timeout=60)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Failed to parse request as tensorflow.serving.PredictRequest")
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/tensorflow.serving.PredictionService/Explain")(b"", timeout=60)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert list(stub.Predict(predict_request("addk_1", 1.0), timeout=60).outputs["y"].float_val) == [2.0]


def test_request_over_the_size_limit_then_still_serving(stub):
    big = predict_request("addk_1")
    big.inputs["x"].CopyFrom(float_tensor([1.0] * (MAX_RECEIVE // 4 + 1024)))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(big, timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert list(stub.Predict(predict_request("addk_1", 1.0), timeout=60).outputs["y"].float_val) == [2.0]


def test_rest_request_over_the_size_limit(serve):
    body = b'{"instances": [' + b"1.0," * (MAX_RECEIVE // 4) + b"1.0]}"
    reply = requests.post(f"{serve.rest_url}/v1/models/addk_1:predict", data=body, timeout=60)
    assert reply.status_code == 429
    assert reply.json() == {"error": f"request body larger than the limit of {MAX_RECEIVE} bytes"}
    reply = requests.post(f"{serve.rest_url}/v1/models/addk_1:predict", json={"instances": [1.0]}, timeout=60)
    assert reply.json() == {"predictions": [2.0]}


# -- placement and answers ------------------------------------------------------------


def test_every_answer_comes_from_the_model_asked_for(stub):
    def ask(i):
        k, x = i % 8, float(i)
        response = stub.Predict(predict_request(f"addk_{k}", x), timeout=60)
        return k, x, response.model_spec.name, list(response.outputs["y"].float_val)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(160)))
    for k, x, name, y in results:
        assert (name, y) == (f"addk_{k}", [x + k])


def test_each_model_is_placed_on_its_ring_owner_only(stub, serve):
    ring = Ring(["node0", "node1"])
    for k in range(8):
        stub.Predict(predict_request(f"addk_{k}"), timeout=60)
    owners = {ring.owner(f"addk_{k}") for k in range(8)}
    assert owners == {"node0", "node1"}  # the eight models spread over both nodes
    for node in ("node0", "node1"):
        with grpc.insecure_channel(f"127.0.0.1:{serve.node_ports(node)['grpc']}") as channel:
            node_stub = model_service_pb2_grpc.ModelServiceStub(channel)
            for k in range(8):
                request = get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = f"addk_{k}"
                try:
                    states = [s.state for s in node_stub.GetModelStatus(request, timeout=30).model_version_status]
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND
                    states = []
                assert (30 in states) == (ring.owner(f"addk_{k}") == node), (node, k, states)


def test_sigterm_drains_and_stops_the_nodes(serve):
    """Runs last in this module: serve exits 0 on SIGTERM and its nodes are gone."""
    nodes = [psutil.Process(serve.node_ports(name)["pid"]) for name in ("node0", "node1")]
    assert serve.stop() == 0
    gone, alive = psutil.wait_procs(nodes, timeout=30)
    assert not alive, alive
