"""``tfscache serve --backend triton``'s Open Inference Protocol surfaces, end to end.

One real ``tfscache serve --backend triton --local-nodes 1`` (its tritonserver child) and,
to compare against, one raw ``tritonserver`` over the same repository, both module-scoped.
The clients are the official ``tritonclient.grpc`` and ``tritonclient.http`` and plain HTTP.
What loaded is read from the node's own RepositoryIndex, never from tfscache's word.

* the server, model and inference surfaces over gRPC and REST (JSON and binary tensors),
  each answered as raw Triton answers;
* ModelReady loads nothing;
* error texts of an unknown model and an unknown version: Triton's own, as raw Triton's;
* bad input (malformed gRPC bytes, unsafe names, an oversized request) gets a clear error
  with the right code, and the server keeps serving.
"""

from __future__ import annotations


import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc
import tritonclient.http as tritonhttp
from google.protobuf.json_format import MessageToDict
from tritonclient.utils import InferenceServerException

from tfscache.frontend.protocols.oip.server_metadata import UNSERVED_EXTENSIONS

from support.oip import client_pairs
from support.triton import index_states, resident_models, serve_triton_nodes
from support.waiting import wait_until

LIMIT = 1 << 20  # --max-receive-message-size
# REST infers below ask for an uncompressed reply (requests asks for gzip by default): what a
# compressed one looks like is test_rest_compressed_reply_keeps_its_content_encoding's subject.
IDENTITY = {"Accept-Encoding": "identity"}
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


SERVE_ARGS = ("--local-nodes", "1", "--max-receive-message-size", str(LIMIT))  # conftest's ``served``


@pytest.fixture(scope="module")
def serve(served):
    return served[0]


@pytest.fixture(scope="module")
def node_target(serve) -> str:
    return f"127.0.0.1:{serve_triton_nodes(serve)['node0']['grpc']}"


@pytest.fixture(scope="module")
def clients(serve, triton):
    """gRPC and HTTP clients of tfscache ("tfs") and of the raw Triton ("raw")."""
    with client_pairs(serve, triton) as made:
        yield made


def x_input(module, values, binary: bool | None = None):
    tensor = module.InferInput("x", [len(values)], "FP32")
    data = np.array(values, dtype=np.float32)
    if binary is None:
        tensor.set_data_from_numpy(data)
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def grpc_infer(client, name: str, values, version: str = "") -> list[float]:
    return client.infer(name, [x_input(tritongrpc, values)], model_version=version,
                        client_timeout=120).as_numpy("y").tolist()


def outcome(call, *args, **kwargs):
    """(status, message) of a tritonclient error, else the result."""
    try:
        return call(*args, **kwargs)
    except InferenceServerException as exc:
        return exc.status(), exc.message()


def as_dict(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True)


def test_server_live_ready_and_metadata(serve, triton, clients):
    tfs, raw = clients["tfs"][0], clients["raw"][0]
    assert tfs.is_server_live() and tfs.is_server_ready()
    served, node = as_dict(tfs.get_server_metadata()), as_dict(raw.get_server_metadata())
    assert served["version"] == "2.51.0"
    # the node's answer less what tfscache refuses (repository API) or does not serve
    assert "model_repository" in node["extensions"]
    assert served == {**node, "extensions": [
        e for e in node["extensions"] if e not in UNSERVED_EXTENSIONS]}
    assert "model_repository" not in served["extensions"]
    assert "binary_tensor_data" in served["extensions"]
    for path in ("/v2/health/live", "/v2/health/ready"):
        reply = requests.get(f"{serve.rest_url}{path}", timeout=30)
        assert (reply.status_code, reply.text) == (200, "")
    reply = requests.get(f"{serve.rest_url}/v2", timeout=30)
    assert reply.status_code == 200
    node = requests.get(f"{triton.http_url}/v2", timeout=30).json()
    assert "model_repository" in node["extensions"]
    assert reply.json() == {**node, "extensions": [
        e for e in node["extensions"] if e not in UNSERVED_EXTENSIONS]}
    assert reply.json()["name"] == "triton"


def test_model_ready_loads_nothing(serve, node_target, clients):
    tfs = clients["tfs"][0]
    assert tfs.is_model_ready("addk_5")  # on disk: a request for it would load it
    assert tfs.is_model_ready("addk_5", "1")
    for path in ("/v2/models/addk_5/ready", "/v2/models/addk_5/versions/1/ready"):
        reply = requests.get(f"{serve.rest_url}{path}", timeout=30)
        assert (reply.status_code, reply.text) == (200, "")
    assert not tfs.is_model_ready("addk_5", "2")  # no version 2 on disk
    reply = requests.get(f"{serve.rest_url}/v2/models/addk_5/versions/2/ready", timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": "Model version not ready"})
    # The node never heard of a load of it: listed (it is in the repository) with no state.
    assert index_states(node_target)["addk_5"] == {""}
    assert "addk_5" not in resident_models(node_target)


def test_grpc_metadata_config_infer_and_statistics(node_target, clients):
    tfs, raw = clients["tfs"][0], clients["raw"][0]
    raw.load_model("addk_4", client_timeout=60)
    metadata = as_dict(tfs.get_model_metadata("addk_4"))  # takes a lease: loads it
    assert "addk_4" in resident_models(node_target)
    assert metadata == as_dict(raw.get_model_metadata("addk_4"))
    assert metadata["name"] == "addk_4" and metadata["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("x", "FP32", ["-1"])]
    assert as_dict(tfs.get_model_metadata("addk_4", "1")) == metadata
    config = as_dict(tfs.get_model_config("addk_4"))
    assert config == as_dict(raw.get_model_config("addk_4"))
    assert config["config"]["backend"] == "python"
    assert grpc_infer(tfs, "addk_4", [1.0, 2.5]) == [5.0, 6.5]
    assert grpc_infer(tfs, "addk_4", [0.0], version="1") == [4.0]
    stats = as_dict(tfs.get_inference_statistics("addk_4"))["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("addk_4", "1")]
    # Triton counts a request once its response is released, which may be just after the
    # client has it: poll until both infers are counted.
    wait_until(lambda: int(as_dict(tfs.get_inference_statistics("addk_4"))["model_stats"][0]
                           ["inference_stats"]["success"].get("count", 0)) >= 2, 30, "both infers counted")
    assert as_dict(tfs.get_inference_statistics("addk_4", "1"))["model_stats"][0]["name"] == "addk_4"


def test_rest_surfaces(serve, triton, clients):
    tfs_http = clients["tfs"][1]
    clients["raw"][0].load_model("addk_6", client_timeout=60)
    base = f"{serve.rest_url}/v2/models/addk_6"
    metadata = requests.get(base, timeout=120)
    assert metadata.status_code == 200
    assert metadata.json() == requests.get(f"{triton.http_url}/v2/models/addk_6", timeout=30).json()
    assert requests.get(f"{base}/versions/1", timeout=30).json() == metadata.json()
    config = requests.get(f"{base}/config", timeout=30)
    assert config.status_code == 200
    assert config.json() == requests.get(f"{triton.http_url}/v2/models/addk_6/config", timeout=30).json()
    assert (requests.get(f"{base}/ready", timeout=30).status_code,
            requests.get(f"{base}/versions/1/ready", timeout=30).status_code) == (200, 200)
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, -1.0]}]}
    reply = requests.post(f"{base}/infer", json=body, headers=IDENTITY, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2], "data": [7.0, 5.0]}]
    assert reply.json()["model_name"] == "addk_6" and reply.json()["model_version"] == "1"
    reply = requests.post(f"{base}/versions/1/infer", json=body, headers=IDENTITY, timeout=120)
    assert reply.json()["outputs"][0]["data"] == [7.0, 5.0]
    # The binary tensor extension, both ways (Inference-Header-Content-Length passes through).
    result = tfs_http.infer("addk_6", [x_input(tritonhttp, [0.5, 1.5, 2.5], binary=True)],
                            outputs=[tritonhttp.InferRequestedOutput("y", binary_data=True)])
    assert result.as_numpy("y").tolist() == [6.5, 7.5, 8.5]
    assert result.get_output("y")["parameters"]["binary_data_size"] == 12
    stats = requests.get(f"{base}/stats", timeout=30)
    assert stats.status_code == 200
    [model] = stats.json()["model_stats"]
    assert (model["name"], model["version"]) == ("addk_6", "1")
    wait_until(lambda: requests.get(f"{base}/stats", timeout=30).json()["model_stats"][0]
               ["inference_stats"]["success"]["count"] >= 3, 30, "the three infers counted")
    assert tfs_http.is_model_ready("addk_6") and tfs_http.is_server_live()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_rest_compressed_reply_keeps_its_content_encoding(serve, triton, clients, encoding):
    # Triton compresses an infer reply when the client accepts it; tfscache passes the client's
    # Accept-Encoding on and the compressed body back, so it must pass Content-Encoding back too.
    clients["raw"][0].load_model("addk_7", client_timeout=60)
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    expected = [{"name": "y", "datatype": "FP32", "shape": [2], "data": [8.0, 9.0]}]
    replies = {}
    for label, url in (("raw", triton.http_url), ("tfs", serve.rest_url)):
        reply = requests.post(f"{url}/v2/models/addk_7/infer", json=body, headers={"Accept-Encoding": encoding},
                              timeout=120)
        replies[label] = (reply.status_code, reply.headers.get("Content-Encoding"), reply.content)
    assert replies["raw"][:2] == (200, encoding)  # what Triton does: the reference
    assert replies["tfs"][:2] == replies["raw"][:2], replies
    assert requests.models.complexjson.loads(replies["tfs"][2])["outputs"] == expected
    # The official client asking for a compressed reply (it decompresses by Content-Encoding).
    result = clients["tfs"][1].infer("addk_7", [x_input(tritonhttp, [1.0, 2.0], binary=False)],
                                     response_compression_algorithm=encoding)
    assert result.as_numpy("y").tolist() == [8.0, 9.0]


def test_unknown_model_and_version_get_tritons_own_errors(serve, triton, clients):
    tfs, raw = clients["tfs"][0], clients["raw"][0]
    raw.load_model("addk_8", client_timeout=60)
    for client in (tfs, raw):
        assert grpc_infer(client, "addk_8", [0.0]) == [8.0]  # loaded on both: version 5 is what is unknown
    calls = [("infer", lambda c, n, v: grpc_infer(c, n, [1.0], version=v)),
             ("metadata", lambda c, n, v: c.get_model_metadata(n, v)),
             ("config", lambda c, n, v: c.get_model_config(n, v)),
             ("statistics", lambda c, n, v: c.get_inference_statistics(n, v)),
             ("ready", lambda c, n, v: c.is_model_ready(n, v))]
    expected = {("infer", "ghost", ""): ("StatusCode.NOT_FOUND", "Request for unknown model: 'ghost' is not found"),
                ("infer", "addk_8", "5"): ("StatusCode.NOT_FOUND",
                                           "Request for unknown model: 'addk_8' version 5 is not found"),
                ("statistics", "ghost", ""): ("StatusCode.INVALID_ARGUMENT",
                                              "requested model 'ghost' is not available"),
                ("ready", "ghost", ""): False, ("ready", "addk_8", "5"): False}
    for what, call in calls:
        for name, version in (("ghost", ""), ("addk_8", "5")):
            answer = outcome(call, tfs, name, version)
            assert answer == outcome(call, raw, name, version), (what, name, version, answer)
            if (what, name, version) in expected:
                assert answer == expected[what, name, version]
            elif what != "statistics":
                assert answer[0] == "StatusCode.NOT_FOUND", (what, name, version, answer)
    for path in ("/v2/models/ghost", "/v2/models/ghost/config", "/v2/models/ghost/stats", "/v2/models/ghost/ready",
                 "/v2/models/addk_8/versions/5", "/v2/models/addk_8/versions/5/config",
                 "/v2/models/addk_8/versions/5/ready", "/v2/models/addk_8/versions/x"):
        ours = requests.get(f"{serve.rest_url}{path}", timeout=30)
        theirs = requests.get(f"{triton.http_url}{path}", timeout=30)
        assert (ours.status_code, ours.text) == (theirs.status_code, theirs.text), path
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    for path, status, text in (("/v2/models/ghost/infer", 404, "Request for unknown model: 'ghost' is not found"),
                               ("/v2/models/addk_8/versions/5/infer", 404,
                                "Request for unknown model: 'addk_8' version 5 is not found")):
        ours = requests.post(f"{serve.rest_url}{path}", json=body, headers=IDENTITY, timeout=30)
        theirs = requests.post(f"{triton.http_url}{path}", json=body, headers=IDENTITY, timeout=30)
        assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()) == (status, {"error": text})


def test_an_unknown_version_of_a_model_on_no_node_gets_tritons_text(serve, node_target, triton, clients):
    """Issue 23: a version the repository lacks of a model no node has ever held is answered as raw
    Triton serving that model answers (not "'addk_11' is not found", the text of a node that never
    loaded it), over gRPC and REST; an unknown name names no version, whatever version was asked."""
    tfs, raw = clients["tfs"][0], clients["raw"][0]
    raw.load_model("addk_11", client_timeout=60)  # the reference: a Triton that serves the model
    assert index_states(node_target)["addk_11"] == {""}  # tfscache's node never loaded it: no state
    calls = {"infer": lambda c, n, v: grpc_infer(c, n, [1.0], version=v),
             "metadata": lambda c, n, v: c.get_model_metadata(n, v),
             "config": lambda c, n, v: c.get_model_config(n, v),
             "statistics": lambda c, n, v: c.get_inference_statistics(n, v),
             "ready": lambda c, n, v: c.is_model_ready(n, v)}
    missing = ("StatusCode.NOT_FOUND", "Request for unknown model: 'addk_11' version 9 is not found")
    ghost = ("StatusCode.NOT_FOUND", "Request for unknown model: 'ghost' is not found")
    expected = {("infer", "addk_11"): missing, ("metadata", "addk_11"): missing, ("config", "addk_11"): missing,
                ("statistics", "addk_11"): ("StatusCode.INVALID_ARGUMENT",
                                            "requested model version is not available for model 'addk_11'"),
                ("ready", "addk_11"): False,
                ("infer", "ghost"): ghost, ("metadata", "ghost"): ghost, ("config", "ghost"): ghost,
                ("statistics", "ghost"): ("StatusCode.INVALID_ARGUMENT", "requested model 'ghost' is not available"),
                ("ready", "ghost"): False}
    for (what, name), answer in expected.items():
        assert outcome(calls[what], raw, name, "9") == answer, (what, name)  # raw Triton says so
        assert outcome(calls[what], tfs, name, "9") == answer, (what, name)
    rest = {"/v2/models/addk_11/versions/9": (404, missing[1]),
            "/v2/models/addk_11/versions/9/config": (404, missing[1]),
            "/v2/models/addk_11/versions/9/stats": (400, expected["statistics", "addk_11"][1]),
            "/v2/models/addk_11/versions/9/ready": (400, "Model version not ready"),
            "/v2/models/ghost/versions/9": (404, ghost[1]), "/v2/models/ghost/versions/9/ready":
            (400, "Model version not ready")}
    for path, (status, text) in rest.items():
        for url in (triton.http_url, serve.rest_url):
            reply = requests.get(f"{url}{path}", timeout=30)
            assert (reply.status_code, reply.json()) == (status, {"error": text}), (url, path)
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    for name, text in (("addk_11", missing[1]), ("ghost", ghost[1])):
        for url in (triton.http_url, serve.rest_url):
            reply = requests.post(f"{url}/v2/models/{name}/versions/9/infer", json=body, headers=IDENTITY, timeout=30)
            assert (reply.status_code, reply.json()) == (404, {"error": text}), (url, name)
    assert index_states(node_target)["addk_11"] == {""}  # and nothing was loaded for it
    raw.unload_model("addk_11")


def assert_still_serving(serve, clients) -> None:
    assert serve.process.poll() is None
    assert grpc_infer(clients["tfs"][0], "addk_2", [1.0]) == [3.0]
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_2/infer", timeout=60, headers=IDENTITY,
                          json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [2.0]}]})
    assert reply.json()["outputs"][0]["data"] == [4.0]


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x80", b"\x12\x03"])
def test_malformed_grpc_bytes_are_invalid_argument(serve, clients, garbage):
    with grpc.insecure_channel(serve.grpc_target) as channel:
        infer = channel.unary_unary(INFER_PATH)  # no serializers: raw bytes both ways
        with pytest.raises(grpc.RpcError) as caught:
            infer(garbage, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "Failed to parse request as inference.ModelInferRequest"
    assert_still_serving(serve, clients)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "x\0y"])
def test_unsafe_model_names_are_invalid_argument(serve, node_target, clients, name):
    tfs = clients["tfs"][0]
    shown = repr(name)
    problem = "a model name must not be '.' or '..'" if name == ".." else \
        "a model name must be one path segment (no '/' or NUL)"
    assert outcome(grpc_infer, tfs, name, [1.0]) == ("StatusCode.INVALID_ARGUMENT",
                                                      f"Invalid model name {shown}: {problem}")
    if "\0" not in name and name != "..":
        quoted = name.replace("/", "%2F")
        reply = requests.post(f"{serve.rest_url}/v2/models/{quoted}/infer", timeout=30, headers=IDENTITY,
                              json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        assert (reply.status_code, reply.json()) == (400, {"error": f"Invalid model name {shown}: {problem}"})
    assert not any(("/" in n or n.startswith("..")) for n in index_states(node_target))
    assert_still_serving(serve, clients)


def test_unknown_model_is_not_found_and_loads_nothing(serve, node_target, clients):
    assert outcome(grpc_infer, clients["tfs"][0], "no_such_model", [1.0]) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'no_such_model' is not found")
    assert "no_such_model" not in index_states(node_target)
    assert_still_serving(serve, clients)


def test_oversized_requests_are_resource_exhausted(serve, clients):
    count = LIMIT // 4 + 1000  # FP32: just over the limit in tensor bytes alone
    assert outcome(grpc_infer, clients["tfs"][0], "addk_2", [0.0] * count) == (
        "StatusCode.RESOURCE_EXHAUSTED", f"SERVER: Received message larger than max ({4 * count + 28} vs. {LIMIT})")
    body = {"inputs": [{"name": "x", "shape": [count], "datatype": "FP32", "data": [0.0] * count}]}
    reply = requests.post(f"{serve.rest_url}/v2/models/addk_2/infer", json=body, headers=IDENTITY, timeout=60)
    assert (reply.status_code, reply.json()) == (429, {"error": f"request body larger than the limit of {LIMIT} bytes"})
    binary = clients["tfs"][1]
    with pytest.raises(InferenceServerException) as caught:
        binary.infer("addk_2", [x_input(tritonhttp, [0.0] * count, binary=True)])
    assert (caught.value.status(), caught.value.message()) == (
        "429", f"request body larger than the limit of {LIMIT} bytes")
    assert_still_serving(serve, clients)


def test_errors_carry_tritons_status_and_content_type(serve, triton, clients):
    """Errors tfscache writes itself (an unknown model on no node, not ready, no such URL, a method
    not allowed) carry the status and Content-Type raw Triton 2.51 sends for the same request:
    text/plain for infer and readiness errors and URL errors, JSON for the rest (generate's too)."""
    raw = clients["raw"][0]
    raw.load_model("addk_9", client_timeout=60)
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    bad = {"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    cases = [("GET", "/v2/models/ghost", None), ("GET", "/v2/models/ghost/ready", None),
             ("GET", "/v2/models/addk_9/ready", None),
             ("GET", "/v2/models/ghost/versions/9/ready", None), ("POST", "/v2/models/ghost/infer", body),
             ("POST", "/v2/models/ghost/generate", {"x": [1.0]}),
             ("POST", "/v2/models/addk_9/infer", bad), ("GET", "/v2/models/ghost/stats", None),
             ("GET", "/v2/models/ghost/config", None), ("GET", "/v2/nosuch", None),
             ("PUT", "/v2/models/addk_9/infer", None), ("GET", "/v2/models/addk_9/infer", None)]
    seen = set()
    for method, path, payload in cases:
        got = [requests.request(method, url + path, json=payload, headers=IDENTITY, timeout=60)
               for url in (triton.http_url, serve.rest_url)]
        answers = [(r.status_code, r.headers.get("Content-Type"), r.text) for r in got]
        assert answers[0] == answers[1], (method, path, answers)
        seen.add(answers[0][1])
    assert seen == {"text/plain", "application/json"}  # both kinds of answer were compared
    ready = requests.get(serve.rest_url + "/v2/models/ghost/ready", timeout=30)
    assert (ready.status_code, ready.headers["Content-Type"]) == (400, "text/plain")
    # tritonclient.http reads the error text whatever its Content-Type
    with pytest.raises(InferenceServerException) as caught:
        clients["tfs"][1].infer("ghost", [x_input(tritonhttp, [1.0])])
    assert (caught.value.status(), caught.value.message()) == (
        "404", "Request for unknown model: 'ghost' is not found")
    raw.unload_model("addk_9")
