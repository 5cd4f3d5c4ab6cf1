"""Version labels alone: labels.json in the repository, and the request rewriting that
replaces a label by its version (checked against the official tensorflow_serving messages)."""

from __future__ import annotations

import json

import grpc
import pytest
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import get_model_status_pb2, inference_pb2, predict_pb2

from frontend.test_embedded import float_tensor
from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import METHODS, RouteKey
from tfscache.frontend.protocols.tfserving.rest import parse_url
from tfscache.repository.local import ModelRepository

PREDICT = METHODS["/tensorflow.serving.PredictionService/Predict"]
MULTI = METHODS["/tensorflow.serving.PredictionService/MultiInference"]
STATUS = METHODS["/tensorflow.serving.ModelService/GetModelStatus"]
LABELS = {("m", "stable"): 7, ("m", "canary"): 8}


def resolve(name: str, label: str) -> int:
    try:
        return LABELS[(name, label)]
    except KeyError:
        raise errors.InvalidArgument(f"Unrecognized servable version label: {label}") from None


def full_predict(label: str | None) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.model_spec.signature_name = "sig"
    if label is not None:
        request.model_spec.version_label = label
    request.inputs["x"].CopyFrom(float_tensor([1.0, 2.0, 3.0], [3, 1]))
    request.inputs["z"].CopyFrom(float_tensor([4.0]))
    request.output_filter.extend(["y", "w"])
    return request


def test_a_label_becomes_its_version_and_nothing_else_changes():
    original = full_predict("stable")
    data = original.SerializeToString()
    key, rewritten = PREDICT.with_versions(data, PREDICT.route_key(data), resolve)
    assert key == RouteKey("m", version=7)
    parsed = predict_pb2.PredictRequest.FromString(rewritten)
    expected = full_predict(None)
    expected.model_spec.version.value = 7
    assert parsed == expected
    assert parsed.model_spec.WhichOneof("version_choice") == "version"


def test_requests_without_a_label_keep_their_bytes():
    for request in (full_predict(None), predict_pb2.PredictRequest()):
        data = request.SerializeToString()
        key = PREDICT.route_key(data)
        assert PREDICT.with_versions(data, key, resolve) == (key, data)
    with_version = full_predict(None)
    with_version.model_spec.version.value = 3
    data = with_version.SerializeToString()
    assert PREDICT.with_versions(data, PREDICT.route_key(data), resolve)[1] is data


def test_get_model_status_ignores_labels():
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "m"
    request.model_spec.version_label = "no-such-label"
    data = request.SerializeToString()
    key = STATUS.route_key(data)
    assert STATUS.with_versions(data, key, resolve) == (key, data)


def test_unknown_label_raises_tf_servings_error():
    data = full_predict("nope").SerializeToString()
    with pytest.raises(errors.InvalidArgument) as info:
        PREDICT.with_versions(data, PREDICT.route_key(data), resolve)
    assert (info.value.grpc_code, info.value.message) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope")


def multi_request(*labels) -> inference_pb2.MultiInferenceRequest:
    request = inference_pb2.MultiInferenceRequest()
    for index, label in enumerate(labels):
        task = request.tasks.add(method_name="tensorflow/serving/regress")
        task.model_spec.name = "m"
        task.model_spec.signature_name = f"s{index}"
        if label is not None:
            task.model_spec.version_label = label
    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(2.0)
    request.input.example_list.examples.append(example)
    return request


def test_multi_inference_rewrites_every_tasks_label():
    data = multi_request("stable", "canary", None, "nope").SerializeToString()
    key, rewritten = MULTI.with_versions(data, MULTI.route_key(data), resolve)
    assert key == RouteKey("m", version=7)
    parsed = inference_pb2.MultiInferenceRequest.FromString(rewritten)
    expected = multi_request(None, None, None, "nope")
    expected.tasks[0].model_spec.version.value = 7
    expected.tasks[1].model_spec.version.value = 8
    # TF Serving reads only the first task's version: a later label that does not resolve stays.
    assert parsed == expected


def test_multi_inference_first_task_label_must_resolve():
    data = multi_request("nope", "stable").SerializeToString()
    with pytest.raises(errors.InvalidArgument, match="^Unrecognized servable version label: nope$"):
        MULTI.with_versions(data, MULTI.route_key(data), resolve)


@pytest.mark.parametrize(("method", "path", "node_path"), [
    ("POST", "/v1/models/m/labels/stable:predict", "/v1/models/m/versions/7:predict"),
    ("POST", "/V1/MODELS/m/LABELS/stable:regress", "/V1/MODELS/m/versions/7:regress"),
    ("POST", "/v1/models/m%2Dx/labels/st%61ble:classify", "/v1/models/m%2Dx/versions/7:classify"),
    ("GET", "/v1/models/m/labels/stable/metadata", "/v1/models/m/versions/7/metadata"),
])
def test_rest_label_url_becomes_a_version_url(method, path, node_path):
    route = parse_url(method, path)
    assert route.key.label == "stable"
    assert route.with_version(path, 7) == (RouteKey(route.key.name, version=7), node_path)


def test_rest_status_url_keeps_its_label():
    path = "/v1/models/m/labels/stable"
    route = parse_url("GET", path)
    assert route.verb == "status"
    assert route.with_version(path, 7) == (route.key, path)


# -- labels.json in the repository ---------------------------------------------------------


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    return ModelRepository(tmp_path, rescan_s=0.0)


def test_labels_file_resolves_labels(repo):
    (repo.root / "m" / "labels.json").write_text('{"stable": 1, "canary": 2}')
    assert (repo.label_version("m", "stable"), repo.label_version("m", "canary")) == (1, 2)


@pytest.mark.parametrize("name", ["m", "no_such_model"])
def test_no_labels_file_knows_no_label(repo, name):
    with pytest.raises(errors.InvalidArgument, match="^Unrecognized servable version label: stable$"):
        repo.label_version(name, "stable")


@pytest.mark.parametrize(("text", "problem"), [
    ('{"stable": 1,', "Expecting property name enclosed in double quotes: line 1 column 14 (char 13)"),
    ("[1, 2]", "expected a JSON object of label -> version number"),
    ('{"stable": "1"}', "label 'stable': version must be a non-negative integer, got \"1\""),
    ('{"stable": true}', "label 'stable': version must be a non-negative integer, got true"),
    ('{"stable": -1}', "label 'stable': version must be a non-negative integer, got -1"),
    ('{"stable": 1.5}', "label 'stable': version must be a non-negative integer, got 1.5"),
    ('{"": 1}', "a label must not be empty"),
])
def test_a_malformed_labels_file_is_invalid_argument_naming_it(repo, text, problem):
    path = repo.root / "m" / "labels.json"
    path.write_text(text)
    with pytest.raises(errors.InvalidArgument) as info:
        repo.label_version("m", "stable")
    assert info.value.message == f"Malformed version labels file {path}: {problem}"
    assert info.value.http_status == 400


def test_labels_are_remembered_for_rescan_s(tmp_path):
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "labels.json"
    path.write_text(json.dumps({"stable": 1}))
    repo = ModelRepository(tmp_path, rescan_s=3600.0)
    assert repo.label_version("m", "stable") == 1
    path.write_text(json.dumps({"stable": 2}))
    assert repo.label_version("m", "stable") == 1  # not read again within rescan_s
    repo.rescan_s = 0.0
    assert repo.label_version("m", "stable") == 2


def test_labels_of_an_unsafe_name_are_never_read(repo):
    with pytest.raises(errors.UnsafeModelName):
        repo.label_version("..", "stable")
