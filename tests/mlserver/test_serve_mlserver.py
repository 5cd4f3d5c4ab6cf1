"""``tfscache serve --backend mlserver``'s Open Inference Protocol surfaces, end to end.

One real ``tfscache serve --backend mlserver --local-nodes 1`` (its ``mlserver start`` child,
at most two models resident) and, to compare against, the session's raw MLServer over the same
repository. Clients are the official ``tritonclient.grpc`` and ``tritonclient.http`` (JSON
tensors) and plain ``requests``. What loaded is read from the node's own repository index,
never from tfscache's word.

* lazy load on first request, for each client, and for scikit-learn and XGBoost models alike;
* a readiness probe loads nothing;
* unknown models and versions: MLServer's own status codes and texts, as raw MLServer answers;
* what MLServer lacks (binary tensors over REST, ModelConfig, ModelStatistics) is refused at
  once, without loading anything;
* hostile input (unsafe names, bad tensors, oversized bodies) gets a clear error, and the
  server keeps serving;
* 16 clients churning over four models with room for two: no request fails, and the node's
  index never shows three resident.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc
import tritonclient.http as tritonhttp
from tritonclient.utils import InferenceServerException

from support.serving import start_serve
from support.mlserver import PATIENT, IndexSampler, index_states, mlserver_infer, resident_models, serve_nodes
from support.traffic import ClientLoop
from support.oip import client_pairs
from support.waiting import wait_until

LIMIT = 1 << 20  # --max-receive-message-size


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-serve"), mlserver_repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", mlserver_bin, "--max-models-per-node", "2",
                     "--max-receive-message-size", str(LIMIT),
                     *PATIENT) as process:
        yield process


@pytest.fixture(scope="module")
def node_url(serve) -> str:
    return f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"


@pytest.fixture(scope="module")
def clients(serve, mlserver):
    """gRPC and HTTP clients of tfscache ("tfs") and of the raw MLServer ("raw")."""
    with client_pairs(serve, mlserver) as made:
        yield made


def body(x: float, shape=(1, 1)) -> dict:
    return {"inputs": [{"name": "x", "shape": list(shape), "datatype": "FP32", "data": [x]}]}


def test_each_client_loads_its_model_on_first_request(serve, node_url, clients):
    grpc_client, http_client = clients["tfs"]
    assert not resident_models(node_url) & {"addk_1", "addk_2", "addk_3"}
    assert mlserver_infer(tritongrpc, grpc_client, "addk_1", 5.0) == [6.0]
    assert "addk_1" in resident_models(node_url)
    assert mlserver_infer(tritonhttp, http_client, "addk_2", 5.0) == [7.0]
    assert "addk_2" in resident_models(node_url)
    # requests with and without a Content-Type: MLServer takes JSON only as application/json,
    # tfscache sends a body that has none, or the form type of a plain `curl -d`, as that.
    raw = '{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[5]}]}'
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for kwargs in ({"json": body(5.0)}, {"data": raw}, {"data": raw, "headers": form}):
        reply = requests.post(f"{serve.rest_url}/v2/models/addk_3/infer", timeout=120, **kwargs)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [8.0]
    assert "addk_3" in resident_models(node_url)


def test_sklearn_classifier_and_xgboost_answer_as_raw_mlserver(clients, node_url):
    for name, x in (("sk_clf", [[1.0, 1.0], [-1.0, -1.0]]), ("xgb_reg", [[1.0, 1.0], [0.5, -2.0]])):
        answers = {}
        for side, (grpc_client, _) in clients.items():
            if side == "raw":
                grpc_client.load_model(name, client_timeout=120)
            tensor = tritongrpc.InferInput("x", [2, 2], "FP32")
            tensor.set_data_from_numpy(np.array(x, dtype=np.float32))
            answers[side] = grpc_client.infer(name, [tensor], client_timeout=120).as_numpy("predict").tolist()
        assert answers["tfs"] == answers["raw"], (name, answers)
        assert name in resident_models(node_url)
    assert [row[0] if isinstance(row, list) else row for row in answers["tfs"]] != []
    clients["raw"][0].unload_model("sk_clf")
    clients["raw"][0].unload_model("xgb_reg")


def test_a_readiness_probe_loads_nothing(clients, node_url):
    grpc_client, http_client = clients["tfs"]
    assert "addk_5" not in resident_models(node_url)
    assert grpc_client.is_model_ready("addk_5") is True  # on disk: a request would load it
    assert http_client.is_model_ready("addk_5", "1") is True
    assert "addk_5" not in resident_models(node_url)


def grpc_error(client, name: str, version: str = "") -> tuple[str, str]:
    tensor = tritongrpc.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer(name, [tensor], model_version=version, client_timeout=60)
    return info.value.status(), info.value.message()


def test_unknown_models_and_versions_get_mlserver_s_own_answers(serve, mlserver, clients):
    raw, tfs = clients["raw"][0], clients["tfs"][0]
    raw.load_model("addk_1")
    try:
        for name, version in (("ghost", ""), ("ghost", "3"), ("addk_1", "7")):
            expected = grpc_error(raw, name, version)
            assert expected[0] == "StatusCode.NOT_FOUND", expected
            assert grpc_error(tfs, name, version) == expected
        # ModelReady of an unknown model: MLServer 1.7 answers UNKNOWN with its exception's class name.
        with pytest.raises(InferenceServerException) as raw_ready:
            raw.is_model_ready("ghost")
        with pytest.raises(InferenceServerException) as tfs_ready:
            tfs.is_model_ready("ghost")
        assert (tfs_ready.value.status(), tfs_ready.value.message()) == \
            (raw_ready.value.status(), raw_ready.value.message()) == \
            ("StatusCode.UNKNOWN", "Unexpected <class 'mlserver.errors.ModelNotFound'>: Model ghost with version  "
                                   "not found")
        for path in ("/v2/models/ghost/infer", "/v2/models/ghost/versions/3/infer", "/v2/models/addk_1/versions/7/infer"):
            raw_reply = requests.post(mlserver.http_url + path, json=body(1.0), timeout=60)
            tfs_reply = requests.post(serve.rest_url + path, json=body(1.0), timeout=60)
            assert (tfs_reply.status_code, tfs_reply.json()) == (raw_reply.status_code, raw_reply.json()) == \
                (404, {"error": raw_reply.json()["error"]}), path
            assert raw_reply.json()["error"].startswith("Model ") and raw_reply.json()["error"].endswith("not found")
    finally:
        raw.unload_model("addk_1")


def test_a_failed_load_gets_mlserver_s_reason_and_the_server_keeps_serving(clients):
    raw, tfs = clients["raw"][0], clients["tfs"][0]
    with pytest.raises(InferenceServerException) as raw_load:
        raw.load_model("broken", client_timeout=60)
    assert raw_load.value.status() == "StatusCode.INTERNAL", raw_load.value.message()
    status, message = grpc_error(tfs, "broken")
    assert status == "StatusCode.INTERNAL"
    assert message.startswith("load failed for model 'broken' version 1 on node node0: "), message
    assert message.endswith(raw_load.value.message()), (message, raw_load.value.message())
    assert grpc_error(tfs, "broken")[0] == "StatusCode.INTERNAL"  # backing off: the same answer
    assert mlserver_infer(tritongrpc, tfs, "addk_1", 2.0) == [3.0]


def test_what_mlserver_lacks_is_refused_without_loading(serve, node_url, clients):
    grpc_client, http_client = clients["tfs"]
    assert "addk_6" not in resident_models(node_url)
    # The binary tensor extension: 400 at once with a clear text (raw MLServer: 422 "JSON decode error").
    tensor = tritonhttp.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], dtype=np.float32), binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("addk_6", [tensor])
    assert info.value.status() == "400" and "binary tensor extension" in info.value.message()
    # ModelConfig and ModelStatistics: MLServer has neither (gRPC UNIMPLEMENTED, REST 404).
    for call in (grpc_client.get_model_config, grpc_client.get_inference_statistics):
        with pytest.raises(InferenceServerException) as info:
            call("addk_6")
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    for path in ("/v2/models/addk_6/config", "/v2/models/addk_6/stats"):
        assert requests.get(serve.rest_url + path, timeout=60).status_code == 404
    assert "addk_6" not in resident_models(node_url)


def test_hostile_input_gets_clear_errors_and_the_server_keeps_serving(serve, clients):
    grpc_client, _ = clients["tfs"]
    for name in ("../../etc/passwd", "a/b", "x" * 4000, "addk_1\x00", ".."):
        status, message = grpc_error(grpc_client, name)
        assert status in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT"), (name[:20], status, message)
    for path in ("/v2/models/..%2F..%2Fetc/infer", "/v2/models/%2e%2e/infer"):
        reply = requests.post(serve.rest_url + path, json=body(1.0), timeout=60)
        assert reply.status_code in (400, 404) and "error" in reply.json(), (path, reply.text)
    # Bad tensors: MLServer's own errors, passed through (a shape the data does not fill, text data).
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_1/infer", json=body(1.0, (1, 2)), timeout=60)
    assert reply.status_code == 500 and "reshape" in reply.json()["error"], reply.text
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_1/infer", timeout=60,
                          json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": ["a"]}]})
    assert reply.status_code == 500 and "could not convert" in reply.json()["error"], reply.text
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_1/infer", data="{not json", timeout=60,
                          headers={"Content-Type": "application/json"})
    assert reply.status_code == 422, reply.text
    bad = tritongrpc.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("addk_1", [bad], client_timeout=60)
    assert info.value.status() == "StatusCode.INTERNAL" and "features" in info.value.message()
    # Oversized bodies: refused by the front end, over both transports.
    big = {"inputs": [{"name": "x", "shape": [1, 300_000], "datatype": "FP32", "data": [1.0] * 300_000}]}
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_1/infer", json=big, timeout=60)
    assert reply.status_code == 413 or (reply.status_code == 429 and "larger than" in reply.text), reply.text
    huge = tritongrpc.InferInput("x", [1, LIMIT // 4 + 16], "FP32")
    huge.set_data_from_numpy(np.zeros((1, LIMIT // 4 + 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("addk_1", [huge], client_timeout=60)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert mlserver_infer(tritongrpc, grpc_client, "addk_1", 2.0) == [3.0]  # still serving


class Churn(ClientLoop):
    """tritonclient.grpc and tritonclient.http (JSON) clients, one model after another."""

    def __init__(self, serve, models: list[str], clients: int = 16) -> None:
        super().__init__(models, clients, timeout=120.0)
        self.serve = serve
        self.errors = (InferenceServerException, OSError)

    def client(self, worker: int) -> None:
        if worker % 4 == 3:
            client = tritonhttp.InferenceServerClient(f"127.0.0.1:{self.serve.rest_port}", network_timeout=120)
            module = tritonhttp
        else:
            client = tritongrpc.InferenceServerClient(self.serve.grpc_target)
            module = tritongrpc
        try:
            self.loop(worker, lambda name, x: mlserver_infer(module, client, name, x))
        finally:
            client.close()


def test_sixteen_clients_churning_fail_nothing_and_the_count_cap_holds(serve, node_url):
    churn_holds_the_cap(serve, node_url)


def churn_holds_the_cap(serve, node_url) -> None:
    """16 clients over four models with room for two on node0: no failure, the node's index never
    shows three resident, and models came and went."""
    models = ["addk_1", "addk_2", "addk_3", "addk_4"]
    with IndexSampler({"node0": node_url}) as sampler:
        with Churn(serve, models) as churn:
            wait_until(lambda: churn.done() >= 200 or churn.failures(), 600, "200 requests of churn")
    churn.check()
    assert churn.done() >= 200
    assert sampler.count() > 0 and sampler.errors == 0
    assert sampler.peak("node0") <= 2, [s for s in sampler.samples["node0"] if len(s) > 2][:3]
    seen = [frozenset(s) for s in sampler.samples["node0"] if s]
    assert sum(1 for a, b in zip(seen, seen[1:]) if a != b) >= 2  # models came and went
    assert set(index_states(node_url)) >= set(models)


def test_errors_carry_mlserver_s_status_and_content_type(serve, mlserver, clients):
    """Errors tfscache writes itself carry the status, Content-Type and body raw MLServer 1.7 sends
    for the same request: JSON throughout, FastAPI's ``{"detail": ...}`` for a URL or method."""
    raw = clients["raw"][0]
    raw.load_model("addk_2")
    try:
        cases = [("GET", "/v2/models/ghost"), ("POST", "/v2/models/ghost/infer"),
                 ("GET", "/v2/nosuch"), ("GET", "/v2/models/addk_2/stats"),
                 ("GET", "/v2/models/addk_2/config"),
                 ("PUT", "/v2/models/addk_2/infer"), ("GET", "/v2/models/addk_2/ready")]
        for method, path in cases:
            payload = body(1.0) if method == "POST" else None
            got = [requests.request(method, url + path, json=payload, timeout=60)
                   for url in (mlserver.http_url, serve.rest_url)]
            answers = [(r.status_code, r.headers.get("Content-Type"), r.text) for r in got]
            assert answers[0] == answers[1], (method, path, answers)
    finally:
        raw.unload_model("addk_2")
