"""The REST API of a real ``tfscache node`` over the network (docs/upstream/tfserving.md,
"REST API").

Cases from TF Serving's tensorflow_model_server_test.py (the *REST tests) and
http_rest_api_handler_test.cc, plus every error the adapter maps. Requests go
through http.client so paths reach the server exactly as written (requests
would re-quote them).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
from urllib.parse import urlsplit

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.node import model_config, start_node, wait_for_states
from support.requests import reload_request
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from tfscache.modelserver.rest_api import INTERNAL_ERROR_MESSAGE, RestHandler, make_rest_app

@pytest.fixture(scope="module")
def node(tmp_path_factory, test_models):
    # "default" is TF Serving's half_plus_two_cpu (only version 123); "two" is the
    # handler test's saved_model_half_plus_two_2_versions. As in that test, labels
    # are set by a reload once the versions are available (a start-up config may
    # not label a version that has not loaded yet).
    models = {"default": test_models / "half_plus_two", "two": test_models / "half_plus_two",
              "tf2": test_models / "half_plus_two_tf2"}
    policies = dict(default="model_version_policy { specific { versions: 123 } }",
                    two="model_version_policy { all {} }")
    with start_node(tmp_path_factory.mktemp("rest"), config=model_config(models, **policies)) as node:
        with grpc.insecure_channel(node.grpc_target) as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            wait_for_states(stub, "two", {123: "AVAILABLE", 124: "AVAILABLE"})
            labels = ('version_labels { key: "stable" value: 123 } '
                      'version_labels { key: "canary" value: 124 }')
            config = model_config(models, default=policies["default"], two=f"{policies['two']} {labels}")
            response = stub.HandleReloadConfigRequest(reload_request(config), timeout=30)
            assert response.status.error_code == 0, response.status.error_message
        yield node


class Reply:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self):
        return json.loads(self.body)

    @property
    def error(self) -> str:
        body = self.json()
        assert list(body) == ["error"], body
        return body["error"]


def call(node, method: str, path: str, body: str | bytes | None = None, headers=None) -> Reply:
    url = urlsplit(node.rest_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        connection.close()


def post(node, path: str, doc) -> Reply:
    return call(node, "POST", path, doc if isinstance(doc, (str, bytes)) else json.dumps(doc))


def assert_error(reply: Reply, status: int, message: str) -> None:
    assert (reply.status, reply.error) == (status, message)
    assert reply.headers["Content-Type"] == "application/json"


# -- TF Serving's end-to-end REST tests (tensorflow_model_server_test.py) -----------------

def test_classify_rest(node):
    reply = post(node, "/v1/models/default:classify",
                 {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert reply.status == 200 and reply.json() == {"results": [[["", 3.0]]]}
    assert reply.text == '{\n    "results": [[["", 3.0]]\n    ]\n}'


def test_regress_rest(node):
    reply = post(node, "/v1/models/default:regress",
                 {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
    assert reply.status == 200 and reply.json() == {"results": [3.0]}
    assert reply.text == '{\n    "results": [3.0]\n}'


def test_predict_rest(node):
    reply = post(node, "/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]})
    assert reply.status == 200 and reply.json() == {"predictions": [3.0, 3.5, 4.0]}
    assert reply.text == '{\n    "predictions": [3.0, 3.5, 4.0\n    ]\n}'
    assert reply.headers["Content-Type"] == "application/json"


def test_predict_columnar_rest(node):
    reply = post(node, "/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]})
    assert reply.status == 200 and reply.json() == {"outputs": [3.0, 3.5, 4.0]}


def test_get_status_rest(node):
    reply = call(node, "GET", "/v1/models/default")
    assert reply.status == 200 and reply.headers["Content-Type"] == "application/json"
    assert reply.json() == {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}


def tensor_info(name: str, dims: list[int]) -> dict:
    shape = {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False}
    return {"dtype": "DT_FLOAT", "tensor_shape": shape, "name": name}


def test_get_model_metadata_rest(node):
    reply = call(node, "GET", "/v1/models/default/metadata")
    assert reply.status == 200
    doc = reply.json()
    assert doc["model_spec"] == {"name": "default", "signature_name": "", "version": "123"}
    signatures = doc["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {"serving_default", "classify_x_to_y", "regress_x_to_y",
                               "regress_x_to_y2", "regress_x2_to_y3", "classify_x2_to_y3"}
    assert signatures["serving_default"] == {
        "inputs": {"x": tensor_info("x:0", [-1, 1])},
        "outputs": {"y": tensor_info("y:0", [-1, 1])},
        "method_name": "tensorflow/serving/predict",
        "defaults": {}}
    classify_input = signatures["classify_x_to_y"]["inputs"]["inputs"]
    assert (classify_input["name"], classify_input["dtype"]) == ("tf_example:0", "DT_STRING")
    assert signatures["classify_x_to_y"]["method_name"] == "tensorflow/serving/classify"


# -- http_rest_api_handler_test.cc: versions and labels ---------------------------------

@pytest.mark.parametrize("prefix", ["/v1/models/two", "/v1/models/two/versions/123",
                                    "/v1/models/two/labels/stable"])
def test_predict_regress_classify_by_version_and_label(node, prefix):
    reply = post(node, f"{prefix}:predict", {"instances": [[1.0, 2.0], [3.0, 4.0]]})
    assert (reply.status, reply.json()) == (200, {"predictions": [[2.5, 3.0], [3.5, 4.0]]})
    reply = post(node, f"{prefix}:predict", {"signature_name": "serving_default", "inputs": [3.0, 4.0]})
    assert (reply.status, reply.json()) == (200, {"outputs": [3.5, 4.0]})
    reply = post(node, f"{prefix}:regress",
                 {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]})
    assert (reply.status, reply.json()) == (200, {"results": [42.0]})
    reply = post(node, f"{prefix}:classify",
                 {"signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]})
    assert (reply.status, reply.json()) == (200, {"results": [[["", 12.0]]]})


def test_status_by_version_and_label(node):
    available = {"state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    reply = call(node, "GET", "/v1/models/two/versions/123")
    assert reply.json() == {"model_version_status": [{"version": "123", **available}]}
    # The label is ignored by GetModelStatus: every version comes back.
    for path in ("/v1/models/two/labels/stable", "/v1/models/two/labels/no_such_label", "/v1/models/two"):
        reply = call(node, "GET", path)
        assert reply.json() == {"model_version_status": [
            {"version": "123", **available}, {"version": "124", **available}]}, path


def test_metadata_by_version_and_label(node):
    for path, version in (("/v1/models/two/versions/123/metadata", "123"),
                          ("/v1/models/two/labels/canary/metadata", "124"),
                          ("/v1/models/two/metadata", "124")):
        reply = call(node, "GET", path)
        assert reply.status == 200
        assert reply.json()["model_spec"] == {"name": "two", "signature_name": "", "version": version}


def test_names_and_labels_are_url_decoded_and_paths_case_insensitive(node):
    reply = post(node, "/v1/models/de%66ault:predict", {"instances": [2.0]})
    assert (reply.status, reply.json()) == (200, {"predictions": [3.0]})
    reply = post(node, "/v1/models/two/labels/st%61ble:regress",
                 {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]})
    assert (reply.status, reply.json()) == (200, {"results": [42.0]})
    reply = post(node, "/V1/MODELS/default/VERSIONS/00000123:predict", {"instances": [2.0]})
    assert (reply.status, reply.json()) == (200, {"predictions": [3.0]})
    # TF Serving compares the subresource case-sensitively: /METADATA is a status request.
    reply = call(node, "GET", "/v1/models/default/METADATA")
    assert reply.status == 200 and "model_version_status" in reply.json()


def test_predict_runs_a_regress_signature_and_multi_row_shapes(node):
    # Predict may run any signature (no method-name check by default).
    reply = post(node, "/v1/models/default:predict",
                 {"signature_name": "regress_x2_to_y3", "instances": [[2.0], [4.0]]})
    assert (reply.status, reply.json()) == (200, {"predictions": [[4.0], [5.0]]})
    reply = post(node, "/v1/models/default:predict",
                 {"signature_name": "regress_x2_to_y3", "inputs": {"inputs": [[2.0]], "extra": 1}})
    assert (reply.status, reply.json()) == (200, {"outputs": [[4.0]]})
    reply = post(node, "/v1/models/default:predict", {"instances": [{"x": [1.0]}, {"x": [3.0]}]})
    assert (reply.status, reply.json()) == (200, {"predictions": [[2.5], [3.5]]})


def test_tf2_saved_model(node):
    # tf.saved_model.save signatures: x is float [1] with a default; classify/regress
    # parse serialized Examples inside the function.
    reply = post(node, "/v1/models/tf2:predict", {"instances": [2.0]})
    assert (reply.status, reply.json()) == (200, {"predictions": [3.0]})
    reply = post(node, "/v1/models/tf2:classify",
                 {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert (reply.status, reply.json()) == (200, {"results": [[["", 3.0]]]})
    reply = post(node, "/v1/models/tf2:regress",
                 {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}, {"x": 4.0}]})
    assert (reply.status, reply.json()) == (200, {"results": [3.0, 4.0]})


def test_examples_with_context(node):
    reply = post(node, "/v1/models/default:regress", {
        "signature_name": "regress_x_to_y", "context": {"unused": "c"},
        "examples": [{"x": 2.0}, {"x": [4.0]}]})
    assert (reply.status, reply.json()) == (200, {"results": [3.0, 4.0]})


# -- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/foo"),
    ("POST", "/v1/foo"),
    ("GET", "/v1/models/debug/model_name"),
    ("POST", "/v1/models"),
    ("GET", "/v1/models/foo:predict"),
    ("GET", "/v1/models/foo/version/50:predict"),
    ("POST", "/v1/models/foo/version/50:regress"),
    ("POST", "/v1/models/foo/versions/HELLO:regress"),
    ("POST", "/v1/models/foo/metadata"),
    ("POST", "/v1/models/foo/label/some_label:regress"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress"),
    ("POST", "/v1/models/foo/versions/some_label:regress"),
    ("POST", "/v1/models/default:PREDICT"),
    ("POST", "/v1/models/default:explain"),
    ("PUT", "/v1/models/default"),
    ("DELETE", "/v1/models/default"),
    ("HEAD", "/v1/models/default"),
])
def test_malformed_requests(node, method, path):
    reply = call(node, method, path, body="{}")
    assert reply.status == 400
    if method != "HEAD":  # a HEAD reply has no body
        assert reply.error == f"Malformed request: {method} {path}"
    assert reply.headers["Content-Type"] == "application/json"


def test_url_errors(node):
    assert_error(call(node, "GET", "/v1/models"), 400, "Missing model name in request.")
    assert_error(post(node, "/v1/models/foo/versions/18446744073709551615:regress", {}), 400,
                 "Failed to convert version: 18446744073709551615 to numeric.")
    assert_error(call(node, "GET", "/v1/models/foo/versions/9223372036854775808"), 400,
                 "Failed to convert version: 9223372036854775808 to numeric.")


@pytest.mark.parametrize("path", ["/", "/v1", "/v2/models/default", "/index", "/statuspage"])
def test_paths_outside_v1_get_a_plain_404(node, path):
    reply = call(node, "GET", path)
    assert reply.status == 404
    assert reply.headers["Content-Type"] != "application/json"
    assert b"404 Not Found" in reply.body


@pytest.mark.parametrize("path, message", [
    ("/v1/models/foo:predict", "Servable not found for request: Latest(foo)"),
    ("/v1/models/foo/versions/50:predict", "Servable not found for request: Specific(foo, 50)"),
    ("/v1/models/default99:predict", "Servable not found for request: Latest(default99)"),
    ("/v1/models/default/versions/124:predict", "Servable not found for request: Specific(default, 124)"),
    ("/v1/models/foo:classify", "Servable not found for request: Latest(foo)"),
    ("/v1/models/foo/versions/7:regress", "Servable not found for request: Specific(foo, 7)"),
])
def test_unknown_model_or_version_is_404(node, path, message):
    body = {"instances": [1.0]} if path.endswith("predict") else {"examples": [{"x": 1.0}]}
    assert_error(post(node, path, body), 404, message)


def test_status_and_metadata_not_found(node):
    assert_error(call(node, "GET", "/v1/models/foo"), 404, "Could not find any versions of model foo")
    assert_error(call(node, "GET", "/v1/models/default/versions/7"), 404,
                 "Could not find version 7 of model default")
    assert_error(call(node, "GET", "/v1/models/foo/metadata"), 404,
                 "Servable not found for request: Latest(foo)")
    assert_error(call(node, "GET", "/v1/models/default/versions/124/metadata"), 404,
                 "Servable not found for request: Specific(default, 124)")


def test_json_errors_win_over_not_found(node):
    assert_error(post(node, "/v1/models/foo:predict", ""), 400, "JSON Parse error: The document is empty")
    assert_error(post(node, "/v1/models/foo:predict", "instances = [1, 2]"), 400,
                 "JSON Parse error: Invalid value. at offset: 0")
    assert_error(post(node, "/v1/models/foo:classify", '{"examples": [}'), 400,
                 "JSON Parse error: Invalid value. at offset: 14")
    # ... but the model is looked up before the inputs are converted.
    assert_error(post(node, "/v1/models/foo:predict", {"instances": ["x", "y"]}), 404,
                 "Servable not found for request: Latest(foo)")


@pytest.mark.parametrize("path, body, message", [
    ("default:predict", '{ "instances": ["x", "y"] }',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     'JSON Value: "x" Type: String is not of expected type: float'),
    ("default:predict", '{ "signature_name": 100 }',
     "JSON Value: {\n    \"signature_name\": 100\n} not formatted correctly. "
     "'signature_name' key must be a string value."),
    ("default:predict", '{"signature_name": "nope", "instances": [1.0]}',
     'Serving signature name: "nope" not found in signature def'),
    ("default:predict", '{"instances": [1.0], "inputs": [1.0]}',
     "JSON Value: {\n    \"instances\": [1.0],\n    \"inputs\": [1.0]\n} Not formatted correctly "
     "expecting only one of 'inputs' or 'instances' keys to exist "),
    ("default:predict", '{"instances": []}',
     "JSON Value: {\n    \"instances\": []\n} No values in 'instances' array"),
    ("default:predict", '{"signature_name": "serving_default"}', "Missing 'inputs' or 'instances' key"),
    ("default:predict", '{"instances": [{"z": 1.0}]}',
     "Failed to process element: 0 key: z of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON object: does not have named input: z"),
    ("default:predict", '{"instances": [[1.0], [1.0, 2.0]]}',
     "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Expecting tensor size: 1 but got: 2"),
    ("two/labels/Version_Nonexistent:predict", '{ "instances": ["x", "y"] }',
     "Unrecognized servable version label: Version_Nonexistent"),
    ("default:classify", '{"signature_name": "nope", "examples": [{"x": 1.0}]}',
     "No signature was found with the name: nope"),
    ("default:regress", '{"signature_name": "regress_x_to_y"}',
     "JSON Value: {\n    \"signature_name\": \"regress_x_to_y\"\n} When method is classify, "
     "key 'examples' is expected and was not found"),
    ("default:regress", '{"examples": []}',
     "JSON Value: {\n    \"examples\": []\n} 'examples' value is an empty array"),
    ("default:classify", '{"examples": [{"x": null}]}',
     "Feature: x has element with unexpected JSON type: Null"),
])
def test_request_errors_are_400(node, path, body, message):
    assert_error(post(node, f"/v1/models/{path}", body), 400, message)


def test_scalar_inputs(node):
    assert_error(post(node, "/v1/models/default:predict", {"instances": 2.0}), 400,
                 "JSON Value: {\n    \"instances\": 2.0\n} Expecting 'instances' to be an list/array")
    reply = post(node, "/v1/models/default:predict", {"inputs": 2.0})
    assert (reply.status, reply.json()) == (200, {"outputs": 3.0})


def test_cors_preflight(node):
    reply = call(node, "OPTIONS", "/v1/models/default:predict", headers={"Origin": "https://example.com"})
    assert (reply.status, reply.body) == (200, b"")
    reply = call(node, "OPTIONS", "/v1/models/default:predict")
    assert (reply.status, reply.body) == (400, b"")


def test_node_keeps_serving_after_errors(node):
    for body in (b"\xff\xfe garbage", b"{" * 10000, b'{"instances": [' + b"1," * 1000 + b"]}"):
        assert post(node, "/v1/models/default:predict", body).status == 400
    reply = post(node, "/v1/models/default:predict", {"instances": [2.0]})
    assert (reply.status, reply.json()) == (200, {"predictions": [3.0]})


# -- the adapter in-process: threads and unexpected errors ------------------------------
# These need a core that blocks or breaks on demand, which a real node cannot be made
# to do; ``GatedCore`` implements only ``status``, the one method these requests reach.

class GatedCore:
    """status(): blocks for model "slow" until released; raises for model "broken"."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def status(self, request):
        name = request.model_spec.name
        if name == "broken":
            raise RuntimeError("injected failure")
        if name == "slow":
            self.entered.set()
            if not self.release.wait(30):
                raise AssertionError("never released")
        response = get_model_status_pb2.GetModelStatusResponse()
        response.model_version_status.add(version=1, state=30)
        return response


@pytest.fixture
async def gated():
    core = GatedCore()
    async with TestClient(TestServer(make_rest_app(core))) as client:
        yield core, client
    core.release.set()


async def test_a_blocked_request_does_not_block_the_loop(gated):
    core, client = gated
    slow = asyncio.ensure_future(client.get("/v1/models/slow"))
    assert await asyncio.get_running_loop().run_in_executor(None, core.entered.wait, 10)
    fast = await client.get("/v1/models/fast")
    assert fast.status == 200 and not slow.done()
    core.release.set()
    reply = await asyncio.wait_for(slow, 10)
    assert reply.status == 200
    assert (await reply.json())["model_version_status"][0]["state"] == "AVAILABLE"


async def test_unexpected_errors_are_500_with_a_generic_message_and_logged(gated, caplog):
    _, client = gated
    with caplog.at_level(logging.ERROR, logger="tfscache.modelserver.rest_api"):
        reply = await client.get("/v1/models/broken")
    assert reply.status == 500 and reply.headers["Content-Type"] == "application/json"
    assert await reply.json() == {"error": INTERNAL_ERROR_MESSAGE}
    [record] = [r for r in caplog.records if r.name == "tfscache.modelserver.rest_api"]
    assert record.exc_info is not None and "injected failure" in str(record.exc_info[1])
    assert "GET /v1/models/broken" in record.getMessage()


def test_rest_timeout_becomes_the_run_timeout():
    assert RestHandler(None, 5000).timeout_s == 5.0
    assert RestHandler(None, 0).timeout_s is None
