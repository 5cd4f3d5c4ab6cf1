"""The front end reads routing keys from the bytes of official tensorflow_serving messages."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     inference_pb2, model_management_pb2, predict_pb2, regression_pb2)

from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import METHODS, RELOAD_PATH, RouteKey
from tfscache.wire import serving_pb2

REQUESTS = {
    "/tensorflow.serving.PredictionService/Predict": predict_pb2.PredictRequest,
    "/tensorflow.serving.PredictionService/Classify": classification_pb2.ClassificationRequest,
    "/tensorflow.serving.PredictionService/Regress": regression_pb2.RegressionRequest,
    "/tensorflow.serving.PredictionService/GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest,
    "/tensorflow.serving.ModelService/GetModelStatus": get_model_status_pb2.GetModelStatusRequest,
}


def test_every_served_method_has_a_reader():
    assert set(METHODS) == {*REQUESTS, "/tensorflow.serving.PredictionService/MultiInference"}
    assert RELOAD_PATH == "/tensorflow.serving.ModelService/HandleReloadConfigRequest"


def _filled(cls):
    """An official request with its payload fields set, so the head is read among other fields."""
    request = cls()
    if cls is predict_pb2.PredictRequest:
        request.inputs["x"].dtype = 1
        request.inputs["x"].float_val.extend([1.0, 2.0])
        request.output_filter.append("y")
    elif cls in (classification_pb2.ClassificationRequest, regression_pb2.RegressionRequest):
        example = request.input.example_list.examples.add()
        example.features.feature["x"].float_list.value.append(2.0)
    elif cls is get_model_metadata_pb2.GetModelMetadataRequest:
        request.metadata_field.append("signature_def")
    return request


@pytest.mark.parametrize("path", sorted(REQUESTS))
@pytest.mark.parametrize("spec, key", [
    ({"name": "m"}, RouteKey("m")),
    ({"name": "m", "version": 7}, RouteKey("m", version=7)),
    ({"name": "m", "version": 0}, RouteKey("m", version=0)),
    ({"name": "m", "version_label": "stable", "signature_name": "s"}, RouteKey("m", label="stable")),
    ({"name": "naïve model ☃", "version": 2**62}, RouteKey("naïve model ☃", version=2**62)),
])
def test_route_key_from_official_request(path, spec, key):
    request = _filled(REQUESTS[path])
    request.model_spec.name = spec["name"]
    if "version" in spec:
        request.model_spec.version.value = spec["version"]
    if "version_label" in spec:
        request.model_spec.version_label = spec["version_label"]
    request.model_spec.signature_name = spec.get("signature_name", "")
    assert METHODS[path].route_key(request.SerializeToString()) == key


@pytest.mark.parametrize("path", sorted(REQUESTS))
def test_no_model_spec_or_no_name_has_no_route_key(path):
    request = _filled(REQUESTS[path])
    assert METHODS[path].route_key(request.SerializeToString()) is None
    request.model_spec.signature_name = "serving_default"
    assert METHODS[path].route_key(request.SerializeToString()) is None


def test_multi_inference_routes_by_first_task():
    request = inference_pb2.MultiInferenceRequest()
    for signature in ("regress_x_to_y", "classify_x_to_y"):
        task = request.tasks.add()
        task.model_spec.name = "half_plus_two"
        task.model_spec.version.value = 123
        task.model_spec.signature_name = signature
        task.method_name = "tensorflow/serving/regress"
    request.input.example_list.examples.add().features.feature["x"].float_list.value.append(2.0)
    method = METHODS["/tensorflow.serving.PredictionService/MultiInference"]
    assert method.route_key(request.SerializeToString()) == RouteKey("half_plus_two", version=123)
    assert method.route_key(inference_pb2.MultiInferenceRequest().SerializeToString()) is None


@pytest.mark.parametrize("path", sorted(METHODS))
def test_malformed_bytes_are_invalid_argument(path):
    with pytest.raises(errors.InvalidArgument) as info:
        METHODS[path].route_key(b"\x0a\xff\xff\xff")
    assert info.value.message.startswith("Failed to parse request as tensorflow.serving.")


def test_wire_messages_round_trip_with_official_ones():
    official = get_model_status_pb2.GetModelStatusResponse()
    entry = official.model_version_status.add(version=123, state=30)
    entry.status.error_code = 5
    entry.status.error_message = "gone"
    ours = serving_pb2.GetModelStatusResponse.FromString(official.SerializeToString())
    assert (ours.model_version_status[0].version, ours.model_version_status[0].state) == (123, 30)
    assert ours.SerializeToString() == official.SerializeToString()
    reload = model_management_pb2.ReloadConfigRequest()
    config = reload.config.model_config_list.config.add(name="m", base_path="/m", model_platform="tensorflow")
    config.model_version_policy.specific.versions.append(3)
    config.version_labels["stable"] = 3
    mine = serving_pb2.ReloadConfigRequest.FromString(reload.SerializeToString())
    assert model_management_pb2.ReloadConfigRequest.FromString(mine.SerializeToString()) == reload


def test_front_end_imports_no_tensorflow():
    code = ("import sys, tfscache.app, tfscache.kinds.supervisor, tfscache.frontend.grpc_server, "
            "tfscache.frontend.protocols.tfserving.rest, tfscache.cache, tfscache.kinds.tfserving.client\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_serving'))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_repeated_model_spec_merges_as_a_full_parse_would():
    first = predict_pb2.PredictRequest()
    first.model_spec.name = "m"
    second = predict_pb2.PredictRequest()
    second.model_spec.version.value = 9
    second.inputs["x"].float_val.append(1.0)
    wire = first.SerializeToString() + second.SerializeToString()  # concatenation = merge
    official = predict_pb2.PredictRequest.FromString(wire)
    assert (official.model_spec.name, official.model_spec.version.value) == ("m", 9)
    assert METHODS["/tensorflow.serving.PredictionService/Predict"].route_key(wire) == RouteKey("m", version=9)


@pytest.mark.parametrize("wire", [b"\x0a\x05ab", b"\x0a", b"\x08", b"\x0b", b"\x12\x80", b"\x00\x01"])
def test_truncated_or_invalid_wire_is_invalid_argument(wire):
    for path in sorted(METHODS):
        with pytest.raises(errors.InvalidArgument):
            METHODS[path].route_key(wire)


def test_large_request_reads_only_the_spec():
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "big"
    request.inputs["x"].tensor_content = b"\x00" * (64 << 20)
    wire = request.SerializeToString()
    assert METHODS["/tensorflow.serving.PredictionService/Predict"].route_key(wire) == RouteKey("big")
