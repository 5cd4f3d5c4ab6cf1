"""Hostile requests through a real ``tfscache serve`` (issue 10, items 8-9): over-long
model names are INVALID_ARGUMENT / 400 with the name cut short, over-long request
lines and headers get 414 / 431 with a quiet log, and the front end keeps serving."""

from __future__ import annotations

import http.client
import json
import re
import socket

import grpc
import pytest
from support.requests import predict_request, status_request
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from support.serving import start_serve

from tfscache.dataplane import binary

LONG = "m" * 16384
LONG_NAME_ERROR = f"Invalid model name '{'m' * 200}...': a model name must be at most 255 bytes, got 16384"


REFUSAL_LOG_PERIOD_S = 0.2  # server.refusal_log_period_s: each test's refusals are reported soon after


@pytest.fixture(scope="module", params=["python", pytest.param("haproxy", marks=pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"))])
def serve(frontend_repo, tmp_path_factory, request):
    """Each data plane in turn (docs/data-plane.md): the same answers either way."""
    with start_serve(tmp_path_factory.mktemp("hostile-serve"), frontend_repo, "--local-nodes", "1",
                     "--set", f"server.refusal_log_period_s={REFUSAL_LOG_PERIOD_S}",
                     "--data-plane", request.param) as serve:
        serve.data_plane = request.param
        yield serve


def _rest(serve, method: str, path: str, body: bytes | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", serve.rest_port, timeout=120)
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


def _assert_serves(serve) -> None:
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert stub.Predict(predict_request("addk_3", 1.0), timeout=120).outputs["y"].float_val == [4.0]
    assert _rest(serve, "POST", "/v1/models/addk_3:predict", b'{"instances": [1.0]}') == (
        200, {"predictions": [4.0]})


def _assert_quiet_log(serve) -> None:
    log = serve.log_text()
    assert "Traceback" not in log
    # Python's log lines: "<time> ERROR name: ..." (serve), "ERROR name: ..." (its nodes)
    assert not re.search(r"^(\S+ \S+ )?ERROR \S+: ", log, re.MULTILINE)


@pytest.mark.parametrize("call", ["Predict", "GetModelStatus"])
def test_long_model_name_is_invalid_argument_over_grpc(serve, call):
    with grpc.insecure_channel(serve.grpc_target) as channel:
        if call == "Predict":
            method, request = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict, predict_request(LONG)
        else:
            method, request = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus, status_request(LONG)
        with pytest.raises(grpc.RpcError) as info:
            method(request, timeout=60)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, LONG_NAME_ERROR)
    _assert_serves(serve)


@pytest.mark.parametrize("method, template, body", [
    ("POST", "/v1/models/{}:predict", b'{"instances": [1.0]}'),
    ("GET", "/v1/models/{}", None),
    ("GET", "/v1/models/{}/metadata", None),
], ids=["predict", "status", "metadata"])
def test_long_model_name_over_rest(serve, method, template, body):
    assert _rest(serve, method, template.format(LONG), body)[0] == 414  # request line over 8 KB
    status, reply = _rest(serve, method, template.format("m" * 4000), body)
    assert (status, reply) == (400, {"error": f"Invalid model name '{'m' * 200}...': a model name must be "
                                              "at most 255 bytes, got 4000"})
    _assert_serves(serve)


def test_grpc_messages_are_cut_to_a_few_kilobytes():
    from tfscache.frontend.grpc_server import MAX_ERROR_BYTES, grpc_message

    assert grpc_message("short") == "short"
    cut = grpc_message("a" * 10_000)
    assert cut == "a" * MAX_ERROR_BYTES + "...TRUNCATED"
    # characters gRPC percent-encodes count three times per byte
    cut = grpc_message("é" * 10_000)
    assert cut == "é" * (MAX_ERROR_BYTES // 6) + "...TRUNCATED"


def _raw(serve, data: bytes) -> bytes:
    """The reply's status line (HAProxy keeps the client's connection open after it)."""
    with socket.create_connection(("127.0.0.1", serve.rest_port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while (chunk := sock.recv(65536)) and b"\r\n" not in b"".join(chunks + [chunk]):
            chunks.append(chunk)
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("data, status", [
    (b"GET /v1/models/" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"414"),
    (b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n", b"431"),
    (b"GET /v1/models/m HTTP/1.1\r\nBad Header\r\n\r\n", b"400"),
], ids=["long-line", "long-header", "malformed"])
def test_unparsable_request_gets_its_status_and_a_quiet_log(serve, data, status):
    for _ in range(3):
        assert re.match(rb"HTTP/1\.[01] " + status + rb" ", _raw(serve, data))
    _assert_serves(serve)
    _assert_quiet_log(serve)
    if serve.data_plane == "haproxy" and status == b"400":
        return  # HAProxy's parser answers a header line without a colon itself, and logs nothing
    serve.wait_for_log(r"REST front end refused malformed HTTP requests: .*\b\d+ x " + status.decode())
