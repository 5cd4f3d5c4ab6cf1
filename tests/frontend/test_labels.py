"""Version labels through a real `tfscache serve`, with unmodified tensorflow_serving clients.

The repository is a copy of half_plus_two (versions 123 and 124, byte-identical graphs, so
the version a request reached shows in the response's model_spec or the metadata) and
addk_5 with versions 1 and 2 (its ``version`` signature answers the version that ran),
and ``mixed`` whose versions 1 and 2 add 5 and 6; each with a labels.json.
``broken_labels`` has a labels.json that is not JSON.
"""

from __future__ import annotations

import json
import shutil

import grpc
import pytest
import requests
from tensorflow_serving.apis import (classification_pb2, get_model_status_pb2, model_service_pb2_grpc, predict_pb2,
                                     regression_pb2)

from support.serving import start_serve
from frontend.test_embedded import assert_spec
from support import fixtures
from support.requests import example_request, metadata_request, predict_request, regress_and_classify_request

LABELS = {"stable": 123, "canary": 124, "gone": 125}


@pytest.fixture(scope="module")
def repo(test_models, synthetic_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("labels") / "models"
    shutil.copytree(test_models / "half_plus_two", root / "half_plus_two")
    (root / "half_plus_two" / "labels.json").write_text(json.dumps(LABELS))
    [addk] = synthetic_models([5], versions=(1, 2))
    shutil.copytree(addk, root / "addk_5")
    (root / "addk_5" / "labels.json").write_text('{"old": 1, "new": 2}')
    # "mixed": version 1 computes x + 5, version 2 x + 6, so a REST answer shows the version.
    plus5, plus6 = synthetic_models([5, 6])
    shutil.copytree(plus5 / "1", root / "mixed" / "1")
    shutil.copytree(plus6 / "1", root / "mixed" / "2")
    (root / "mixed" / "labels.json").write_text('{"old": 1, "new": 2}')
    shutil.copytree(test_models / "half_plus_two", root / "broken_labels")
    (root / "broken_labels" / "labels.json").write_text('{"stable": 123,')
    return root


@pytest.fixture(scope="module")
def serve(repo, tmp_path_factory):
    with start_serve(tmp_path_factory.mktemp("labels-serve"), repo, "--local-nodes", "1") as process:
        yield process


channel = fixtures.channel_to("serve")
stub = fixtures.prediction_stub


def error_of(call, request):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=60)
    return info.value.code(), info.value.details()


# -- gRPC -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("label", "version"), [("stable", 123), ("canary", 124)])
def test_predict_by_label_runs_the_labelled_version(stub, label, version):
    response = stub.Predict(predict_request("half_plus_two", label=label), timeout=60)
    assert list(response.outputs["y"].float_val) == [3.0]
    assert_spec(response.model_spec, "half_plus_two", "serving_default", version)


@pytest.mark.parametrize(("label", "version"), [("old", 1), ("new", 2)])
def test_the_labelled_version_is_the_one_that_runs(stub, label, version):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "addk_5"
    request.model_spec.version_label = label
    request.model_spec.signature_name = "version"
    response = stub.Predict(request, timeout=60)
    assert list(response.outputs["version"].int64_val) == [version]
    assert response.model_spec.version.value == version


def test_classify_and_regress_by_label(stub):
    request = example_request(classification_pb2.ClassificationRequest, "half_plus_two", "classify_x_to_y",
                              label="stable")
    response = stub.Classify(request, timeout=60)
    assert [c.score for c in response.result.classifications[0].classes] == [3.0]
    assert_spec(response.model_spec, "half_plus_two", "classify_x_to_y", 123)
    request = example_request(regression_pb2.RegressionRequest, "half_plus_two", "regress_x_to_y", label="stable")
    response = stub.Regress(request, timeout=60)
    assert [r.value for r in response.result.regressions] == [3.0]
    assert_spec(response.model_spec, "half_plus_two", "regress_x_to_y", 123)


def test_get_model_metadata_by_label(stub):
    response = stub.GetModelMetadata(metadata_request("half_plus_two", label="stable"), timeout=60)
    assert (response.model_spec.name, response.model_spec.version.value) == ("half_plus_two", 123)
    assert list(response.metadata) == ["signature_def"]


def test_multi_inference_by_label_rewrites_every_task(stub):
    response = stub.MultiInference(regress_and_classify_request("half_plus_two", label="stable"), timeout=60)
    assert [r.value for r in response.results[0].regression_result.regressions] == [3.0]
    assert response.results[1].classification_result.classifications[0].classes[0].score == 3.0
    assert_spec(response.results[0].model_spec, "half_plus_two", "regress_x_to_y", 123)
    assert_spec(response.results[1].model_spec, "half_plus_two", "classify_x_to_y", 123)


def test_unknown_label_is_tf_servings_invalid_argument(stub):
    assert error_of(stub.Predict, predict_request("half_plus_two", label="nope")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope")
    # A model with no labels.json (or none at all) knows no label, as in TF Serving.
    assert error_of(stub.Predict, predict_request("no_such_model", label="stable")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: stable")


def test_label_on_a_missing_version_is_not_found(stub):
    assert error_of(stub.Predict, predict_request("half_plus_two", label="gone")) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(half_plus_two, 125)")


def test_malformed_labels_file_is_invalid_argument_naming_it(stub, repo):
    code, message = error_of(stub.Predict, predict_request("broken_labels", label="stable"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(f"Malformed version labels file {repo / 'broken_labels' / 'labels.json'}: ")
    # Requests without a label do not read the file.
    response = stub.Predict(predict_request("broken_labels"), timeout=60)
    assert_spec(response.model_spec, "broken_labels", "serving_default", 124)


def test_get_model_status_ignores_the_label(channel):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    plain = stub.GetModelStatus(request, timeout=60)
    assert 30 in [s.state for s in plain.model_version_status]  # AVAILABLE
    request.model_spec.version_label = "no-such-label"
    assert stub.GetModelStatus(request, timeout=60) == plain


# -- REST -----------------------------------------------------------------------------------


def test_rest_predict_classify_regress_by_label(serve):
    url = serve.rest_url
    reply = requests.post(f"{url}/v1/models/half_plus_two/labels/stable:predict",
                          json={"instances": [2.0, 3.0]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"predictions": [3.0, 3.5]})
    reply = requests.post(f"{url}/v1/models/half_plus_two/labels/canary:classify",
                          json={"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"results": [[["", 3.0]]]})
    reply = requests.post(f"{url}/v1/models/half_plus_two/labels/stable:regress?x=1",
                          json={"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"results": [3.0]})


@pytest.mark.parametrize(("label", "y"), [("old", 6.0), ("new", 7.0)])
def test_rest_predict_by_label_runs_the_labelled_version(serve, label, y):
    reply = requests.post(f"{serve.rest_url}/v1/models/mixed/labels/{label}:predict",
                          json={"instances": [1.0]}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"predictions": [y]})


def test_rest_metadata_and_status_by_label(serve):
    reply = requests.get(f"{serve.rest_url}/v1/models/half_plus_two/labels/stable/metadata", timeout=60)
    assert reply.status_code == 200
    assert reply.json()["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "123"}
    reply = requests.get(f"{serve.rest_url}/v1/models/half_plus_two/labels/canary/metadata", timeout=60)
    assert reply.json()["model_spec"]["version"] == "124"
    # Status ignores labels, as TF Serving does: even an unknown one.
    plain = requests.get(f"{serve.rest_url}/v1/models/half_plus_two", timeout=60)
    reply = requests.get(f"{serve.rest_url}/v1/models/half_plus_two/labels/no-such-label", timeout=60)
    assert (reply.status_code, reply.json()) == (200, plain.json())
    assert "AVAILABLE" in [s["state"] for s in plain.json()["model_version_status"]]


def test_rest_label_errors(serve, repo):
    url = serve.rest_url
    reply = requests.post(f"{url}/v1/models/half_plus_two/labels/nope:predict", json={"instances": [1.0]},
                          timeout=60)
    assert (reply.status_code, reply.json()) == (400, {"error": "Unrecognized servable version label: nope"})
    reply = requests.get(f"{url}/v1/models/half_plus_two/labels/nope/metadata", timeout=60)
    assert (reply.status_code, reply.json()) == (400, {"error": "Unrecognized servable version label: nope"})
    reply = requests.post(f"{url}/v1/models/half_plus_two/labels/gone:predict", json={"instances": [1.0]},
                          timeout=60)
    assert (reply.status_code, reply.json()) == (
        404, {"error": "Servable not found for request: Specific(half_plus_two, 125)"})
    reply = requests.post(f"{url}/v1/models/broken_labels/labels/stable:predict", json={"instances": [1.0]},
                          timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(
        f"Malformed version labels file {repo / 'broken_labels' / 'labels.json'}: ")
