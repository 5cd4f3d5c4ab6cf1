"""Churn through `tfscache serve --backend triton --workers N` (N = 2, 4): 16 clients (tritonclient,
gRPC and HTTP with binary tensors) over six python-backend models on one Triton capped at two.

Not one request fails, every answer is right, and the cap holds at every instant, as Triton's own
RepositoryIndex says (support.triton.IndexSampler). A warm model, delegated to the workers first,
is evicted by the churn from under them (revoked). N = 1, the single process, is
tests/triton/test_triton_churn.py: that code path is unchanged.

The N = 2 serve is the module's (``two_workers``): the streams test runs on it too, over a model
(stream_3) the churn never asks for.
"""

from __future__ import annotations

import contextlib

import pytest
from support.serving import start_serve
from support.waiting import traffic_runs
from support.triton import IndexSampler, OipTraffic, oip_infer, serve_triton_nodes

from support.models import triton as tritonmodels
from workers.conftest import worker_pids

CAP = 2
DURATION_S = 5.0
MODELS = [f"addk_{k}" for k in range(1, 7)]


@pytest.fixture(scope="session")
def triton_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers-triton")
    tritonmodels.build_triton_models(root, synthetic=len(MODELS))
    tritonmodels.build_stream(root, 3, 20, name="stream_3")
    return root


def start_capped(directory, triton_models, workers: int):
    return start_serve(directory, triton_models, "--backend", "triton", "--workers", str(workers),
                       "--local-nodes", "1", "--max-models-per-node", str(CAP))


@pytest.fixture(scope="module")
def two_workers(triton_models, tmp_path_factory):
    with start_capped(tmp_path_factory.mktemp("workers-triton-two"), triton_models, 2) as serve:
        yield serve


@pytest.mark.parametrize("workers", [2, 4])
def test_triton_churn_loses_no_request_and_holds_the_cap(workers, triton_models, tmp_path, request):
    with contextlib.ExitStack() as stack:
        serve = request.getfixturevalue("two_workers") if workers == 2 else \
            stack.enter_context(start_capped(tmp_path, triton_models, workers))
        assert len(worker_pids(serve.pid)) == workers
        nodes = serve_triton_nodes(serve)
        for x in range(20):  # warm first: addk_1 delegated to workers (each call a connection of its own)
            assert oip_infer(serve.grpc_target, "addk_1", float(x)) == [x + 1.0]
        serve.wait_for_log("delegated model addk_1")
        with IndexSampler({"node0": f"127.0.0.1:{nodes['node0']['grpc']}"}) as sampler:
            with OipTraffic(serve.grpc_target, f"127.0.0.1:{serve.rest_port}", MODELS, clients=16,
                            timeout=120.0) as traffic:
                traffic_runs(serve.process, DURATION_S,
                             lambda: len(sampler.samples.get("node0", [])) >= 20)
        assert serve.process.poll() is None
        traffic.check()
        assert {r[0] for r in traffic.results} == set(MODELS)
        samples = sampler.samples.get("node0", [])
        assert len(samples) >= 20, len(samples)
        assert sampler.peak("node0") <= CAP, [s for s in samples if len(s) > CAP][:5]
        assert len(set().union(*samples)) > CAP  # the node really churned
        assert sampler.errors == 0
        assert "revoking model addk_1" in serve.log_text()  # the churn evicted it from under the workers


def test_streams_and_statistics_go_through_a_worker(two_workers):
    """ModelStreamInfer (several models on one client stream) and the statistics through a worker,
    served by the control process's whole path (two models: both fit under the cap)."""
    serve = two_workers
    import queue

    import numpy as np
    import requests
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    answers: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: answers.put(
        ("error", error.message()) if error is not None else
        (result.get_response().id, result.as_numpy("y").tolist())), stream_timeout=120)
    for model, request_id in (("stream_3", "a"), ("addk_2", "b"), ("stream_3", "c")):
        tensor = tritongrpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        client.async_stream_infer(model, [tensor], request_id=request_id)
    client.stop_stream()
    client.close()
    got = list(answers.queue)
    assert not [a for a in got if a[0] == "error"], got
    assert sorted(a[0] for a in got) == ["a", "a", "a", "b", "c", "c", "c"]
    assert ("b", [3.0]) in got
    reply = requests.get(f"http://127.0.0.1:{serve.rest_port}/v2/models/addk_2/stats", timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model_stats"][0]["name"] == "addk_2"
