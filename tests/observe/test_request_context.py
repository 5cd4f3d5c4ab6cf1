"""Log context of a real `tfscache serve --log-json --log-level DEBUG`: each request's lines
carry the model, the node (by its backend name) and the request id, the caller's
``x-request-id`` when it sent one; the embedded node child logs JSON too."""

from __future__ import annotations

import json
import re

import grpc
import pytest
import requests

from support.serving import link_repository, start_serve
from support import fixtures
from support.requests import predict_request


@pytest.fixture(scope="module")
def serve(synthetic_models, tmp_path_factory):
    repo = link_repository(tmp_path_factory.mktemp("context") / "models", synthetic_models([1, 2]))
    with start_serve(tmp_path_factory.mktemp("serve"), repo, "--local-nodes", "1", "--log-json",
                     "--log-level", "DEBUG") as process:
        yield process


stub = fixtures.stub_on("serve")


def json_lines(serve) -> list[dict]:
    return [json.loads(line) for line in serve.log_text().splitlines() if line.startswith("{")]


def lines_of(serve, request_id: str) -> list[dict]:
    serve.wait_for_log(re.escape(f'"request_id": "{request_id}"'))
    return [d for d in json_lines(serve) if d.get("request_id") == request_id]


def test_grpc_request_lines_carry_model_node_and_the_callers_request_id(stub, serve):
    response = stub.Predict(predict_request("addk_1", 1.0), metadata=[("x-request-id", "req-grpc-1")], timeout=60)
    assert list(response.outputs["y"].float_val) == [2.0]
    found = lines_of(serve, "req-grpc-1")
    assert found
    assert all((d["model"], d["node"]) == ("addk_1", "node0") for d in found)
    assert [d["message"] for d in found if d["logger"] == "tfscache.frontend.grpc_server"] == ["Predict: OK"]


def test_rest_request_lines_carry_model_node_and_the_callers_request_id(serve):
    reply = requests.post(f"{serve.rest_url}/v1/models/addk_2:predict", json={"instances": [1.0]},
                          headers={"X-Request-Id": "req-rest-1"}, timeout=60)
    assert (reply.status_code, reply.json()) == (200, {"predictions": [3.0]})
    found = lines_of(serve, "req-rest-1")
    assert found
    assert all((d["model"], d["node"]) == ("addk_2", "node0") for d in found)
    assert [d["message"] for d in found if d["logger"] == "tfscache.frontend.protocols.tfserving.rest"] == [
        "POST /v1/models/addk_2:predict: 200"]


def test_a_request_without_an_id_gets_a_generated_one(stub, serve):
    before = len(json_lines(serve))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_request("nope"), timeout=60)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    pattern = r'"message": "Predict: NOT_FOUND: Servable not found for request: Latest\(nope\)"'
    serve.wait_for_log(pattern)
    [line] = [d for d in json_lines(serve)[before:] if d["logger"] == "tfscache.frontend.grpc_server"]
    assert (line["model"], line["node"]) == ("nope", "node0")
    assert re.fullmatch(r"[0-9a-f]{12}", line["request_id"])


def test_cache_lines_name_the_node_by_its_backend_name(serve):
    loaded = [d for d in json_lines(serve) if d["logger"] == "tfscache.cache" and " loaded " in d["message"]]
    assert [(d["model"], d["node"]) for d in loaded] == [("addk_1", "node0"), ("addk_2", "node0")]
    assert all(d["message"].startswith("node node0: loaded ") for d in loaded)


def test_the_embedded_nodes_lines_are_json(serve):
    # The node writes its own line of a load as it ends, through its own pipe: the cache may
    # have seen the version AVAILABLE (and the earlier tests their answers) before it is read.
    for name in ("addk_1", "addk_2"):
        serve.wait_for_log(re.escape(f'"message": "loaded {name} version 1'))
    node_lines = [d for d in json_lines(serve)  # its loads log as tfscache.node.manager
                  if d["logger"].startswith(("tfscache.node.", "tfscache.modelserver."))]
    messages = [d["message"] for d in node_lines if d["logger"] == "tfscache.node.manager"]
    assert [m.split(" in ")[0] for m in messages if m.startswith("loaded ")] == [
        "loaded addk_1 version 1", "loaded addk_2 version 1"]
    text = serve.log_text().splitlines()
    assert not [line for line in text if re.match(r"(INFO|WARNING|ERROR) tfscache\.", line)]
