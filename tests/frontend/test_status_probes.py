"""Readiness probes do not churn the cache (issue 10, item 10).

A client polls GetModelStatus / ``GET /v1/models/NAME`` until AVAILABLE before it sends
requests, as it does against TF Serving, which loads every model at start-up. Through
tfscache such a poll loads and evicts nothing: for a version not on its node the front
end answers AVAILABLE for the version a request would get (END with the error while a
failed load backs off), in TF Serving's own form; a version loading or resident there is
answered by the node (tfscache.frontend.protocols.tfserving.probe).

One real `tfscache serve` (one embedded node, at most 2 models, metrics on a picked
port) over addk_1 .. addk_10 (y = x + k) and a corrupt model; the node's loads wait while
``gate/NAME.hold`` exists. Tests run in file order on it; each makes the residents it needs.
"""

from __future__ import annotations

import json
import threading

import grpc
import pytest
import requests
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from support.cache import Gate
from support.serving import link_repository, start_serve
from observe.promtext import Scrape
from support import fixtures
from support.node import version_states
from support.requests import predict_request, status_request
from support.waiting import wait_until

CAP = 2
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE  # 30
LOADING = get_model_status_pb2.ModelVersionStatus.LOADING  # 20
END = get_model_status_pb2.ModelVersionStatus.END  # 40
# TF Serving's REST body for a healthy version (json_response's PrettyWriter layout).
AVAILABLE_BODY = ('{\n "model_version_status": [\n  {\n   "version": "1",\n   "state": "AVAILABLE",\n'
                  '   "status": {\n    "error_code": "OK",\n    "error_message": ""\n   }\n  }\n ]\n}\n')


@pytest.fixture(scope="module")
def repo(synthetic_models, tmp_path_factory):
    root = link_repository(tmp_path_factory.mktemp("probes") / "models", synthetic_models(range(1, 11)))
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    return root


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return Gate(tmp_path_factory.mktemp("probe-gate"))


@pytest.fixture(scope="module")
def serve(repo, gate, tmp_path_factory):
    with start_serve(tmp_path_factory.mktemp("probes-serve"), repo, "--local-nodes", "1", "--max-models-per-node",
                     str(CAP), "--metrics-port", "0",
                     "--set", f"node.extra_args=--load_gate_dir={gate.dir}") as process:
        process.metrics_url = f"http://127.0.0.1:{json.loads((process.directory / 'ports.json').read_text())['metrics']}"
        yield process


channel = fixtures.channel_to("serve")
stub = fixtures.prediction_stub
model_stub = fixtures.model_stub


@pytest.fixture(scope="module")
def node_stub(serve):
    """ModelService on the embedded node itself, past the front end."""
    with grpc.insecure_channel(f"127.0.0.1:{serve.node_ports('node0')['grpc']}") as node_channel:
        yield model_service_pb2_grpc.ModelServiceStub(node_channel)


def scrape(serve) -> Scrape:
    return Scrape(requests.get(f"{serve.metrics_url}/metrics", timeout=10).text)


def node_models(serve) -> dict[str, str]:
    """{name: state} of every version in node0's config, from /status."""
    [node] = requests.get(f"{serve.metrics_url}/status", timeout=10).json()["nodes"]
    return {m["name"]: m["state"] for m in node["models"]}


def predict(stub, name: str, x: float = 1.0) -> list[float]:
    return list(stub.Predict(predict_request(name, x), timeout=120).outputs["y"].float_val)


def make_resident(serve, stub, *names: str) -> None:
    """Predict each of ``names`` (y = x + k) until they, and only they, are available on the node."""
    for name in names:
        assert predict(stub, name, 1.0) == [1.0 + int(name.split("_")[1])]
    wanted = {name: "available" for name in names}
    wait_until(lambda: node_models(serve) == wanted, 60, f"exactly {sorted(names)} resident")


def grpc_status(model_stub, name: str, version: int | None = None) -> get_model_status_pb2.GetModelStatusResponse:
    return model_stub.GetModelStatus(status_request(name, version), timeout=30)


def rest_status(serve, name: str, path: str = "") -> requests.Response:
    return requests.get(f"{serve.rest_url}/v1/models/{name}{path}", timeout=30)


def test_probing_models_not_on_the_node_loads_and_evicts_nothing(serve, stub, model_stub, node_stub):
    make_resident(serve, stub, "addk_1", "addk_2")
    before = scrape(serve)
    for _ in range(5):
        for k in range(3, 11):
            name = f"addk_{k}"
            for version in (None, 1):
                response = grpc_status(model_stub, name, version)
                assert [(s.version, s.state, s.status.error_code, s.status.error_message)
                        for s in response.model_version_status] == [(1, AVAILABLE, 0, "")], name
            for path in ("", "/versions/1"):
                reply = rest_status(serve, name, path)
                assert (reply.status_code, reply.headers["Content-Type"], reply.text) == (
                    200, "application/json", AVAILABLE_BODY), name
    after = scrape(serve)
    assert node_models(serve) == {"addk_1": "available", "addk_2": "available"}
    for metric in ("tfscache_loads_total", "tfscache_evictions_total", "tfscache_unloads_total",
                   "tfscache_cache_misses_total"):
        assert after.value(metric) == before.value(metric), metric
    # The node never heard of them: not in its config, not loaded.
    for k in range(3, 11):
        assert version_states(node_stub, f"addk_{k}") == {}
    assert "loaded addk_3 " not in serve.log_text()


def test_a_resident_models_status_comes_from_the_node_and_reads_the_same(serve, stub, model_stub, node_stub):
    make_resident(serve, stub, "addk_1", "addk_2")
    probed_rest = rest_status(serve, "addk_3")
    probed_grpc = grpc_status(model_stub, "addk_3")
    assert version_states(node_stub, "addk_3") == {}  # the front end answered those
    make_resident(serve, stub, "addk_2", "addk_3")
    assert version_states(node_stub, "addk_3") == {1: ("AVAILABLE", 0, "")}
    resident_rest = rest_status(serve, "addk_3")
    assert (resident_rest.status_code, resident_rest.headers["Content-Type"]) == (
        probed_rest.status_code, probed_rest.headers["Content-Type"])
    assert resident_rest.content == probed_rest.content  # byte for byte
    assert grpc_status(model_stub, "addk_3") == probed_grpc
    assert grpc_status(model_stub, "addk_3").SerializeToString() == probed_grpc.SerializeToString()


def test_a_loading_version_is_answered_by_the_node(serve, stub, model_stub, gate):
    make_resident(serve, stub, "addk_1", "addk_2")
    gate.hold("addk_4")
    result: list = []
    sender = threading.Thread(target=lambda: result.append(predict(stub, "addk_4", 1.0)))
    try:
        sender.start()
        wait_until(lambda: gate.waiting("addk_4"), 60, "addk_4's load to reach the gate")
        # The node's own state: LOADING, not the front end's AVAILABLE.
        assert [(s.version, s.state) for s in grpc_status(model_stub, "addk_4").model_version_status] == [
            (1, LOADING)]
        reply = rest_status(serve, "addk_4")
        assert (reply.status_code, reply.json()["model_version_status"][0]["state"]) == (200, "LOADING")
    finally:
        gate.release("addk_4")
        sender.join(120)
    assert result == [[5.0]]


def test_a_failed_load_is_end_with_its_error_while_it_backs_off(serve, stub, model_stub):
    make_resident(serve, stub, "addk_1", "addk_2")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("broken"), timeout=120)
    code, message = info.value.code(), info.value.details()
    assert code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE) and message, (code, message)
    before = scrape(serve)
    response = grpc_status(model_stub, "broken")
    assert [(s.version, s.state, s.status.error_code, s.status.error_message)
            for s in response.model_version_status] == [(1, END, code.value[0], message)]
    reply = rest_status(serve, "broken")
    assert (reply.status_code, reply.json()) == (200, {"model_version_status": [
        {"version": "1", "state": "END", "status": {"error_code": code.name, "error_message": message}}]})
    # The probe did not retry the load either.
    assert scrape(serve).value("tfscache_loads_total") == before.value("tfscache_loads_total")


def test_a_model_not_on_disk_is_not_found(serve, model_stub):
    with pytest.raises(grpc.RpcError) as info:
        grpc_status(model_stub, "nope")
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope")
    reply = rest_status(serve, "nope")
    assert (reply.status_code, reply.json()) == (404, {"error": "Could not find any versions of model nope"})
    with pytest.raises(grpc.RpcError) as info:
        grpc_status(model_stub, "addk_5", 7)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Could not find version 7 of model addk_5")
