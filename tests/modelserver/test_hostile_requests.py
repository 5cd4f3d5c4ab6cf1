"""Hostile requests to a real ``tfscache node`` (issue 10, items 6-9): shapes it cannot
build, requests that would decode to gigabytes, over-long model names, over-long
request lines. Each gets a client error (never INTERNAL / 500), the log stays quiet,
and the node keeps serving."""

from __future__ import annotations

import http.client
import json
import re
import socket

import grpc
import pytest
from support.node import start_node
from support.requests import float_tensor, predict_request, status_request
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

SMALL_BOUND = 1 << 20  # --max_request_tensor_bytes of the bounded node


@pytest.fixture(scope="module")
def node(half_plus_two_node):
    """The session's half_plus_two node (tests/modelserver/conftest.py): these tests leave it as they found it."""
    return half_plus_two_node


@pytest.fixture(scope="module")
def bounded_node(tmp_path_factory, test_models):
    with start_node(tmp_path_factory.mktemp("bounded"), model_name="half_plus_two",
                    model_base_path=str(test_models / "half_plus_two"),
                    flags=[f"--max_request_tensor_bytes={SMALL_BOUND}"]) as node:
        yield node


def _stub(node):
    return prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(node.grpc_target))


def _zeros(shape: list[int]) -> tensor_pb2.TensorProto:
    """A DT_FLOAT tensor with a shape and no values: TF fills it with zeros."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
    for size in shape:
        tensor.tensor_shape.dim.add(size=size)
    return tensor


def _error(call, *args):
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=60)
    return info.value.code(), info.value.details()


def _rest(node, method: str, path: str, body: bytes | None = None) -> tuple[int, dict | str]:
    connection = http.client.HTTPConnection("127.0.0.1", node.rest_port, timeout=60)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data.decode(errors="replace")


def _assert_serves(node) -> None:
    assert _stub(node).Predict(predict_request(), timeout=60).outputs["y"].float_val == [3.0]
    assert _rest(node, "POST", "/v1/models/half_plus_two:predict", b'{"instances": [2.0]}') == (
        200, {"predictions": [3.0]})


def _assert_quiet_log(node) -> None:
    log = node.log_text()
    assert "Traceback" not in log
    assert not re.search(r"^ERROR ", log, re.MULTILINE)  # Python's log lines; TF's own start "E0000"


# -- item 6: shapes that cannot be built ------------------------------------------------------


@pytest.mark.parametrize("shape, reason", [
    ([1] * 300, "Shape [1,1,1,1,1,1,1,1,...] (300 dimensions) has too many dimensions"),
    ([1] * 65, "Shape [1,1,1,1,1,1,1,1,...] (65 dimensions) has 65 dimensions; tfscache node "
               "supports at most 64 (TensorFlow allows 254)"),
    ([2**40, 2**40], f"Shape [{2**40},{2**40}] is too large (more than 2**63 - 1 entries)"),
    ([0, 2**40, 2**40], f"Shape [0,{2**40},{2**40}] is too large (more than 2**63 - 1 entries)"),
], ids=["300-dims", "65-dims", "int64-overflow", "overflow-with-zero"])
def test_unbuildable_shape_is_invalid_argument_over_grpc(node, shape, reason):
    code, details = _error(_stub(node).Predict, predict_request(inputs={"x": _zeros(shape)}))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, f"tensor parsing error: x: {reason}")
    _assert_serves(node)
    _assert_quiet_log(node)


def test_four_tib_of_zeros_is_a_parse_error_on_a_node_without_a_bound(tmp_path, test_models):
    # 2**40 floats: more than this machine's memory; TF Serving's allocation fails, which
    # it reports as "tensor parsing error".
    with start_node(tmp_path, model_name="half_plus_two", model_base_path=str(test_models / "half_plus_two"),
                    flags=["--max_request_tensor_bytes=0"]) as unbounded:
        code, details = _error(_stub(unbounded).Predict, predict_request(inputs={"x": _zeros([2**40])}))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith(f"tensor parsing error: x: the tensor would take {2**42} bytes once "
                                  "decoded, more than this machine's memory (")
        _assert_serves(unbounded)
        _assert_quiet_log(unbounded)


def _nested(depth: int) -> str:
    return "[" * depth + "2.0" + "]" * depth


@pytest.mark.parametrize("depth, reason", [
    (65, "has 65 dimensions; tfscache node supports at most 64 (TensorFlow allows 254)"),
    (300, "has too many dimensions"),
    (100_000, "has too many dimensions"),
])
def test_deep_json_is_400_over_rest(node, depth, reason):
    status, body = _rest(node, "POST", "/v1/models/half_plus_two:predict",
                         f'{{"inputs": {_nested(depth)}}}'.encode())
    assert status == 400
    assert body["error"].startswith("tensor parsing error: x: Shape [1,1,1,1,1,1,1,1,...] "
                                    f"({depth} dimensions) ")
    assert body["error"].endswith(reason)
    _assert_serves(node)
    _assert_quiet_log(node)


def test_deep_json_instances_are_400_over_rest(node):
    status, body = _rest(node, "POST", "/v1/models/half_plus_two:predict",
                         f'{{"instances": [{_nested(70)}]}}'.encode())
    assert status == 400
    assert body["error"].startswith("tensor parsing error: x: Shape [1,1,1,1,1,1,1,1,...] (71 dimensions) has 71")
    _assert_serves(node)


# -- item 7: the bound on a request's decoded size ---------------------------------------------


def test_zero_filled_tensor_over_the_bound_is_resource_exhausted(bounded_node):
    # 28 bytes on the wire, 256 MiB once TF fills the shape with zeros.
    request = predict_request(inputs={"x": _zeros([2**26])})
    code, details = _error(_stub(bounded_node).Predict, request)
    assert (code, details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"Request tensors would take {2**28} bytes once decoded, more than this node's bound of "
        f"{SMALL_BOUND} bytes (set by --max_request_tensor_bytes)")
    _assert_serves(bounded_node)
    _assert_quiet_log(bounded_node)


def test_default_bound_is_one_gib(node):
    code, details = _error(_stub(node).Predict, predict_request(inputs={"x": _zeros([2**28 + 1])}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.endswith(f"more than this node's bound of {2**30} bytes (set by --max_request_tensor_bytes)")
    assert _stub(node).Predict(predict_request(inputs={"x": float_tensor([1.0] * 4)}),
                               timeout=60).outputs["y"].float_val == [2.5] * 4


def test_json_over_the_bound_is_429(bounded_node):
    rows = ",".join(["[" + ",".join(["1"] * 1024) + "]"] * 300)  # 300 x 1024 floats = 1.2 MiB
    status, body = _rest(bounded_node, "POST", "/v1/models/half_plus_two:predict",
                         f'{{"instances": [{rows}]}}'.encode())
    assert (status, body) == (429, {"error": f"Request tensors would take {300 * 1024 * 4} bytes once "
                                             f"decoded, more than this node's bound of {SMALL_BOUND} bytes "
                                             "(set by --max_request_tensor_bytes)"})
    _assert_serves(bounded_node)


def test_negative_bound_is_refused_at_start_up(tmp_path, test_models):
    from support.node import NodeStartError

    with pytest.raises(NodeStartError) as info:
        start_node(tmp_path, model_name="half_plus_two", model_base_path=str(test_models / "half_plus_two"),
                   flags=["--max_request_tensor_bytes=-1"])
    assert "Illegal value for flag --max_request_tensor_bytes: -1 (must be >= 0)" in info.value.log


# -- item 8: over-long model names -------------------------------------------------------------

LONG = "m" * 16384
SHOWN = "m" * 200 + "..."
LONG_NAME_ERROR = f"Invalid model name '{SHOWN}': a model name must be at most 255 bytes, got 16384"


def _metadata_request(name):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = name
    return request


@pytest.mark.parametrize("call", ["Predict", "GetModelMetadata", "GetModelStatus"])
def test_long_model_name_is_invalid_argument_over_grpc(node, call):
    channel = grpc.insecure_channel(node.grpc_target)
    stub, request = {
        "Predict": (prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict, predict_request(LONG)),
        "GetModelMetadata": (prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata,
                             _metadata_request(LONG)),
        "GetModelStatus": (model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus, status_request(LONG)),
    }[call]
    assert _error(stub, request) == (grpc.StatusCode.INVALID_ARGUMENT, LONG_NAME_ERROR)
    _assert_serves(node)


def test_name_of_255_bytes_is_still_not_found(node):
    name = "é" * 127 + "m"  # 255 bytes of UTF-8
    assert _error(_stub(node).Predict, predict_request(name)) == (
        grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({name})")


@pytest.mark.parametrize("method, path, body", [
    ("POST", f"/v1/models/{LONG}:predict", b'{"instances": [2.0]}'),
    ("GET", f"/v1/models/{LONG}", None),
    ("GET", f"/v1/models/{LONG}/metadata", None),
], ids=["predict", "status", "metadata"])
def test_long_model_name_is_400_over_rest(node, method, path, body):
    # 16 KB of name is a request line over 8 KB: refused before it is read (item 9)
    status, _ = _rest(node, method, path, body)
    assert status == 414
    name = "m" * 4000  # under the request line limit, over 255 bytes
    status, reply = _rest(node, method, path.replace(LONG, name), body)
    assert (status, reply) == (400, {"error": f"Invalid model name '{SHOWN}': a model name must be at "
                                              "most 255 bytes, got 4000"})
    _assert_serves(node)


# -- item 9: request lines and headers over the limits -----------------------------------------


def _raw(node, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", node.rest_port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("data, status", [
    (b"GET /v1/models/" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"414 URI Too Long"),
    (b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n",
     b"431 Request Header Fields Too Large"),
    (b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n",
     b"431 Request Header Fields Too Large"),
    (b"GET /v1/models/m HTTP/1.1\r\nBad Header\r\n\r\n", b"400 Bad Request"),
    (b"\x16\x03\x01 not http\r\n\r\n", b"400 Bad Request"),
], ids=["long-line", "long-header", "many-headers", "malformed-header", "not-http"])
def test_unparsable_request_gets_its_status_and_a_quiet_log(node, data, status):
    for _ in range(3):
        reply = _raw(node, data)
        code, text = status.split(b" ", 1)
        assert re.match(rb"HTTP/1\.[01] " + code + rb" ", reply), reply[:200]
        assert reply.endswith(b"\r\n\r\n" + status + b"\n")
    _assert_serves(node)
    _assert_quiet_log(node)


def test_refusals_are_logged_in_one_line_per_period(node):
    before = node.log_text().count("refused malformed HTTP requests")
    for _ in range(20):
        assert _raw(node, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 414 ")
    # at most: a line for the first of these, and one due from refusals of earlier tests
    assert node.log_text().count("refused malformed HTTP requests") - before <= 2
    node.wait_for_log(r"WARNING tfscache\.webserver: REST API refused malformed HTTP requests: "
                      r"\d+ x 414 URI Too Long")
