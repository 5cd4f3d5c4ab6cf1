"""MLServer's own (flat) repository layout through ``tfscache serve --backend mlserver``.

A repository laid out as MLServer users lay it out, ``NAME/model-settings.json`` beside
``model.joblib`` with no version folder, mixed with one versioned model (``NAME/1/``): the
session's ``mlserver_flat_repository`` (tests/mlserver/conftest.py). One ``tfscache serve`` with
one embedded MLServer, capped at two models. What loaded is read from the node's own repository
index. Restarts: test_mlserver_flat_restart.py; buckets:
tests/storage/test_serve_bucket_backends.py.
"""

from __future__ import annotations

import pytest
import requests
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from support.mlserver import PATIENT, IndexSampler, mlserver_infer, resident_models, serve_nodes
from support.serving import start_serve


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_flat_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-flat-serve"), mlserver_flat_repository,
                     "--backend", "mlserver", "--local-nodes", "1", "--node-command", mlserver_bin,
                     "--max-models-per-node", "2", *PATIENT) as process:
        yield process


@pytest.fixture(scope="module")
def node_url(serve) -> str:
    return f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"


@pytest.fixture(scope="module")
def grpc_client(serve):
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    yield client
    client.close()


def infer_url(serve, name: str, version: str = "") -> str:
    versioned = f"/versions/{version}" if version else ""
    return f"{serve.rest_url}/v2/models/{name}{versioned}/infer"


BODY = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [5]}]}


def test_a_flat_model_loads_on_its_first_request(serve, node_url, grpc_client):
    assert "addk_3" not in resident_models(node_url)
    assert mlserver_infer(tritongrpc, grpc_client, "addk_3", 5.0) == [8.0]  # no version at all
    assert "addk_3" in resident_models(node_url)
    reply = requests.post(infer_url(serve, "addk_3"), json=BODY, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [8.0]


def test_mlservers_version_names_reach_the_model(serve, grpc_client):
    assert mlserver_infer(tritongrpc, grpc_client, "addk_1", 5.0, version="v1") == [6.0]
    reply = requests.post(infer_url(serve, "addk_4", "2026-a"), json=BODY, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [9.0]
    assert reply.json()["model_version"] == "2026-a"


def test_a_wrong_version_name_is_mlservers_not_found(serve, grpc_client, node_url):
    before = resident_models(node_url)
    reply = requests.post(infer_url(serve, "addk_2", "v2"), json=BODY, timeout=60)
    expected = {"error": "Model addk_2 with version v2 not found"}
    assert (reply.status_code, reply.json()) == (404, expected)
    with pytest.raises(InferenceServerException) as caught:
        mlserver_infer(tritongrpc, grpc_client, "addk_2", 5.0, version="v2")
    assert (caught.value.status(), caught.value.message()) == (
        "StatusCode.NOT_FOUND", "Model addk_2 with version v2 not found")
    assert "addk_2" not in resident_models(node_url) - before  # nothing loaded for it


def test_a_mixed_repository_and_the_count_cap_hold_under_churn(serve, node_url, grpc_client):
    rounds = [("addk_1", "v1", 6.0), ("addk_2", "", 7.0), ("addk_3", "", 8.0),
              ("addk_4", "2026-a", 9.0), ("addk_5", "1", 10.0)]
    with IndexSampler({"node0": node_url}) as sampler:
        for _ in range(3):
            for name, version, expected in rounds:
                answer = mlserver_infer(tritongrpc, grpc_client, name, 5.0, version=version)
                assert answer == [expected], (name, version)
    assert sampler.count() > 0 and sampler.errors == 0
    assert sampler.peak("node0") <= 2, [s for s in sampler.samples["node0"] if len(s) > 2][:3]
