"""The Open Inference Protocol front end reads routing keys from the bytes of official
Triton requests (tritonclient's generated grpc_service messages), as test_wire_routing.py
does for TF Serving's."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tritonclient.grpc import service_pb2 as triton

from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import RouteKey
from tfscache.frontend.protocols.oip.methods import (METHODS, MODEL_READY_PATH, REFUSED, REPOSITORY_REFUSED, name_request,
                                           parse_version, read_ready, ready_response, unknown_model,
                                           unknown_version)
from tfscache.wire import oip_heads_pb2

SERVICE = "/inference.GRPCInferenceService/"
NAMED = {  # method -> its official request message, with (name field, version field)
    "ModelReady": (triton.ModelReadyRequest, "name", "version"),
    "ModelMetadata": (triton.ModelMetadataRequest, "name", "version"),
    "ModelConfig": (triton.ModelConfigRequest, "name", "version"),
    "ModelStatistics": (triton.ModelStatisticsRequest, "name", "version"),
    "ModelInfer": (triton.ModelInferRequest, "model_name", "model_version"),
}
UNNAMED = {"ServerLive": triton.ServerLiveRequest, "ServerReady": triton.ServerReadyRequest,
           "ServerMetadata": triton.ServerMetadataRequest}


def test_served_and_refused_methods():
    assert set(METHODS) == {SERVICE + name for name in (*NAMED, *UNNAMED)}
    assert set(REFUSED) == {SERVICE + name for name in
                            ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")}
    for error in REFUSED.values():
        assert isinstance(error, errors.FailedPrecondition) and error.message == REPOSITORY_REFUSED
    assert MODEL_READY_PATH == SERVICE + "ModelReady"
    assert METHODS[SERVICE + "ModelInfer"].request_type == "inference.ModelInferRequest"
    # An unknown model is worded by the node (Triton's texts) for the methods naming one.
    assert {m.path for m in METHODS.values() if m.unknown is not None} == {SERVICE + name for name in NAMED}


def _infer_request(name: str, version: str) -> triton.ModelInferRequest:
    request = triton.ModelInferRequest(model_name=name, model_version=version, id="req-1")
    request.parameters["sequence_id"].int64_param = 7
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    request.outputs.add(name="y").parameters["binary_data"].bool_param = True
    request.raw_input_contents.append(b"\x00\x00\x80\x3f" * 2)
    return request


def _official(method: str, name: str, version: str):
    cls, name_field, version_field = NAMED[method]
    if cls is triton.ModelInferRequest:
        return _infer_request(name, version)
    return cls(**{name_field: name, version_field: version})


@pytest.mark.parametrize("method", sorted(NAMED))
@pytest.mark.parametrize("name, version, key", [
    ("m", "", RouteKey("m")),
    ("m", "3", RouteKey("m", version=3)),
    ("m", "0", RouteKey("m", version=0)),
    ("m", "  +12abc", RouteKey("m", version=12)),  # std::stol: blanks, a sign, trailing text ignored
    ("naïve model ☃", str(2**63 - 1), RouteKey("naïve model ☃", version=2**63 - 1)),
])
def test_route_key_from_official_request(method, name, version, key):
    wire = _official(method, name, version).SerializeToString()
    assert METHODS[SERVICE + method].route_key(wire) == key


@pytest.mark.parametrize("method", sorted(NAMED))
def test_no_name_has_no_route_key(method):
    wire = _official(method, "", "").SerializeToString()
    assert METHODS[SERVICE + method].route_key(wire) is None


@pytest.mark.parametrize("method", sorted(UNNAMED))
def test_server_requests_name_no_model(method):
    assert METHODS[SERVICE + method].route_key(UNNAMED[method]().SerializeToString()) is None
    assert METHODS[SERVICE + method].unknown is None


@pytest.mark.parametrize("version, message", [
    ("abc", "failed to get model version from specified version string 'abc' (details: stol), "
            "version should be an integral value > 0"),
    ("99999999999999999999", "failed to get model version from specified version string "
                             "'99999999999999999999' (details: stol), version should be an integral value > 0"),
    (" ", "failed to get model version from specified version string ' ' (details: stol), "
          "version should be an integral value > 0"),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
@pytest.mark.parametrize("method", sorted(NAMED))
def test_bad_version_is_tritons_invalid_argument(method, version, message):
    wire = _official(method, "m", version).SerializeToString()
    with pytest.raises(errors.InvalidArgument) as info:
        METHODS[SERVICE + method].route_key(wire)
    assert info.value.message == message


def test_parse_version():
    assert parse_version("") is None
    assert parse_version("007") == 7
    assert parse_version("\t5 ") == 5


@pytest.mark.parametrize("path", sorted(SERVICE + name for name in NAMED))  # the others read nothing
@pytest.mark.parametrize("wire", [b"\x0a\x05ab", b"\x0a", b"\x08", b"\x0b", b"\x12\x80", b"\x00\x01",
                                  b"\x0a\x02\xff\xfe"])  # the last: a name that is not UTF-8
def test_malformed_bytes_are_invalid_argument(path, wire):
    with pytest.raises(errors.InvalidArgument) as info:
        METHODS[path].route_key(wire)
    assert info.value.message == f"Failed to parse request as {METHODS[path].request_type}"


def test_large_infer_request_reads_only_the_head():
    request = _infer_request("big", "2")
    request.raw_input_contents.append(b"\x00" * (64 << 20))
    wire = request.SerializeToString()
    assert METHODS[SERVICE + "ModelInfer"].route_key(wire) == RouteKey("big", version=2)


def test_repeated_name_takes_the_last_as_a_full_parse_would():
    wire = (triton.ModelInferRequest(model_name="first", model_version="1").SerializeToString()
            + _infer_request("second", "").SerializeToString())
    official = triton.ModelInferRequest.FromString(wire)
    assert (official.model_name, official.model_version) == ("second", "1")
    assert METHODS[SERVICE + "ModelInfer"].route_key(wire) == RouteKey("second", version=1)


def test_wire_messages_round_trip_with_official_ones():
    for ready in (True, False):
        official = triton.ModelReadyResponse(ready=ready)
        assert ready_response(ready) == official.SerializeToString()
        assert read_ready(official.SerializeToString()) is ready
        assert read_ready(triton.ServerReadyResponse(ready=ready).SerializeToString()) is ready
    request = triton.ModelReadyRequest.FromString(name_request(RouteKey("m", version=4)))
    assert (request.name, request.version) == ("m", "4")
    assert triton.ModelReadyRequest.FromString(name_request(RouteKey("m"))) == triton.ModelReadyRequest(name="m")
    head = oip_heads_pb2.ModelNameHead.FromString(_infer_request("m", "5").SerializeToString())
    assert (head.name, head.version) == ("m", "5")


def test_unknown_model_texts_are_tritons():
    assert unknown_model(RouteKey("x")).message == "Request for unknown model: 'x' is not found"
    # Triton looks the name up first: an unknown name's text names no version (measured on 2.51).
    assert unknown_model(RouteKey("mv", version=1)).message == "Request for unknown model: 'mv' is not found"
    assert unknown_model(RouteKey("x")).grpc_code.name == "NOT_FOUND"


def test_unknown_version_answers_are_those_of_a_triton_serving_the_model():
    key = RouteKey("mv", version=9)
    for method in ("ModelInfer", "ModelMetadata", "ModelConfig"):
        answer = unknown_version(method, key)
        assert (answer.grpc_code.name, answer.message) == (
            "NOT_FOUND", "Request for unknown model: 'mv' version 9 is not found")
    stats = unknown_version("ModelStatistics", key)
    assert (stats.grpc_code.name, stats.http_status, stats.message) == (
        "INVALID_ARGUMENT", 400, "requested model version is not available for model 'mv'")
    assert read_ready(unknown_version("ModelReady", key)) is False
    assert METHODS[SERVICE + "ModelReady"].unknown_version(key) == ready_response(False)


def test_front_end_imports_no_tritonclient():
    code = ("import sys, tfscache.frontend.protocols.oip.methods, tfscache.frontend.protocols.oip.rest, tfscache.frontend.protocols.tfserving.probe\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tritonclient', 'tensorflow'))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
