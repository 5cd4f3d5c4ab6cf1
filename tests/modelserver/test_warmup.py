"""Model warm-up in ``tfscache node`` (issue 25), as tensorflow_model_server does it: the records of
``assets.extra/tf_serving_warmup_requests`` are replayed during the load, before AVAILABLE;
``--enable_model_warmup`` and ``--num_request_iterations_for_warmup`` are honoured; the warm-up
metrics are TF Serving's; a bad record fails the load with TF Serving's error.

One node serves several copies of half_plus_two, each with its own warm-up file (built by
``support.models.tfserving.write_warmup``); a second one has warm-up turned off.
"""

from __future__ import annotations

import re
import shutil

import grpc
import pytest
import requests
from support.node import model_config, start_node, wait_for_states
from support.requests import predict_request, reload_request
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_log_pb2, prediction_service_pb2_grpc

from support.models import tfserving as testmodels

PAGE = "/monitoring/prometheus/metrics"
VERSION = 123
GOOD = ("good", "no_file")
BAD = ("bad_record", "not_tfrecord", "bad_signature", "streamed")


def sample(page: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", page, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def models(tmp_path_factory, test_models):
    root = tmp_path_factory.mktemp("warmup")
    bases = {}
    for name in GOOD + BAD:
        bases[name] = root / name
        shutil.copytree(test_models / "half_plus_two" / "00000123", bases[name] / str(VERSION))
    version = {name: base / str(VERSION) for name, base in bases.items()}
    testmodels.write_warmup(version["good"], testmodels.warmup_logs("good"))
    testmodels.write_warmup(version["bad_record"], [b"\xff not a PredictionLog"])
    (version["not_tfrecord"] / "assets.extra").mkdir()
    (version["not_tfrecord"] / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"x" * 64)
    wrong = testmodels.warmup_logs("bad_signature")[0]
    wrong.predict_log.request.model_spec.signature_name = "nope"
    testmodels.write_warmup(version["bad_signature"], [wrong])
    streamed = prediction_log_pb2.PredictionLog()
    streamed.predict_streamed_log.request.add()
    testmodels.write_warmup(version["streamed"], [streamed])
    (root / "monitoring.txt").write_text('prometheus_config: { enable: true, path: "%s" }\n' % PAGE)
    return root, bases, version


def node_flags(root, *extra: str) -> list[str]:
    return [f"--monitoring_config_file={root / 'monitoring.txt'}", "--max_num_load_retries=0", *extra]


@pytest.fixture(scope="module")
def node(models):
    """Started with the good models (a failed load at start-up fails the start, as in TF Serving);
    the bad ones added by one ReloadConfig, which reports their failure."""
    root, bases, _ = models
    with start_node(root, config=model_config({name: bases[name] for name in GOOD}),
                    flags=node_flags(root, "--num_request_iterations_for_warmup=2")) as node:
        with grpc.insecure_channel(node.grpc_target) as channel, pytest.raises(grpc.RpcError) as failed:
            model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                reload_request(model_config(bases)), timeout=120)
        node.reload_error = failed.value
        yield node


def states(node, name: str, expected: str) -> tuple[str, int, str]:
    with grpc.insecure_channel(node.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        return wait_for_states(stub, name, {VERSION: expected}, timeout=60)[VERSION]


def test_records_are_replayed_before_available_and_counted(node, models):
    _, _, version = models
    assert states(node, "good", "AVAILABLE")[1] == 0
    page = requests.get(node.rest_url + PAGE, timeout=10).text
    path = str(version["good"])
    # Four records, two replays each: records counted once, each replay ran a session.
    assert sample(page, f':tensorflow:serving:model_warmup_records_read{{model_path="{path}",status="OK"}}') == 4
    assert sample(page, f':tensorflow:serving:model_warmup_latency_count{{model_path="{path}",status="OK"}}') == 1
    for api in ("Predict", "Classify", "Regress"):
        assert sample(page, f':tensorflow:serving:runtime_latency_count{{model_name="good",API="{api}",'
                            f'runtime="TF1"}}') == 2, api
    assert sample(page, ':tensorflow:serving:request_count{model_name="good",status="OK"}') == 0  # not requests
    with grpc.insecure_channel(node.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert list(stub.Predict(predict_request("good", 2.0), timeout=30).outputs["y"].float_val) == [3.0]


def test_a_version_without_a_warmup_file_loads(node, models):
    assert states(node, "no_file", "AVAILABLE")[1] == 0
    page = requests.get(node.rest_url + PAGE, timeout=10).text
    assert f'model_warmup_latency_count{{model_path="{models[2]["no_file"]}"' not in page  # no file: no metrics


@pytest.mark.parametrize("name, code, message", [
    ("bad_record", grpc.StatusCode.INVALID_ARGUMENT, "Failed to parse warmup record: \ufffd not a PredictionLog from {file}"),
    ("not_tfrecord", grpc.StatusCode.DATA_LOSS,
     "corrupted record at 0 (Is this even a TFRecord file?). Please verify your warmup data is in TFRecord format."),
    ("bad_signature", grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.'),
    ("streamed", grpc.StatusCode.UNIMPLEMENTED, "Unsupported log_type for warmup: 7"),
])
def test_a_bad_record_fails_the_load_with_tf_servings_error(node, models, name, code, message):
    _, _, version = models
    file = version[name] / "assets.extra" / "tf_serving_warmup_requests"
    _, error_code, error_message = states(node, name, "END")
    assert (error_code, error_message) == (code.value[0], message.format(file=file))
    page = requests.get(node.rest_url + PAGE, timeout=10).content.decode()  # text/plain, no charset: UTF-8 here
    status = f"{code.name}: {message.format(file=file)}".replace('"', '\\"')  # escaped as the page escapes it
    assert sample(page, f':tensorflow:serving:model_warmup_latency_count{{model_path="{version[name]}",'
                        f'status="{status}"}}') == 1


def test_the_reload_reports_each_failed_warmup(node, models):
    error = node.reload_error
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details().startswith("4 model(s) did not become available: ")
    for name in BAD:
        assert f"{{name: {name} version: {VERSION}}} due to error: " in error.details()


def test_warmup_turned_off_replays_nothing(models):
    root, bases, version = models
    with start_node(root, config=model_config({"good": bases["good"]}),
                    flags=node_flags(root, "--enable_model_warmup=false")) as node:
        assert states(node, "good", "AVAILABLE")[1] == 0
        page = requests.get(node.rest_url + PAGE, timeout=10).text
        assert "model_warmup_records_read{" not in page
        assert 'runtime_latency_count{model_name="good",API="Predict"' not in page
