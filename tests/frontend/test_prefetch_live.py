"""Co-access prefetch end to end: ``tfscache serve`` with a real ``tfscache node`` child learns that
addk_2 follows addk_1, loads addk_2 after a request for addk_1 before addk_2 is asked for, and counts
the prefetch as used (metrics, /status, the request log)."""

from __future__ import annotations

import grpc
import pytest
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import link_repository, start_serve, wait_for_log_rows
from support.requests import predict_request
from support.waiting import wait_until

A, B, C = "addk_1", "addk_2", "addk_3"


@pytest.fixture(scope="module")
def serve(synthetic_models, tmp_path_factory):
    repo = link_repository(tmp_path_factory.mktemp("prefetch") / "models", synthetic_models([1, 2, 3]))
    directory = tmp_path_factory.mktemp("serve")
    with start_serve(directory, repo, "--local-nodes", "1", "--max-models-per-node", "2", "--metrics-port", "0",
                     "--request-log", str(directory / "requests.csv"), "--set", "cache.prefetch=true",
                     "--set", "cache.prefetch_min_support=1.5", "--set", "cache.prefetch_confidence=0.3",
                     "--set", "cache.prefetch_window_s=30", "--set", "cache.policy=lru") as process:
        process.request_log = directory / "requests.csv"
        yield process


def state_of(serve, name: str) -> str | None:
    return next((m["state"] for m in serve.node_status()["models"] if m["name"] == name), None)


def test_a_learned_follower_is_loaded_before_it_is_requested(serve):
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def predict(name: str, k: int) -> None:
            assert list(stub.Predict(predict_request(name, 1.0), timeout=120).outputs["y"].float_val) == [1.0 + k]

        for _ in range(2):  # the pipeline: addk_1 then addk_2
            predict(A, 1)
            predict(B, 2)
        predict(A, 1)
        predict(C, 3)  # two models fit: addk_2, the least recently used, makes room for addk_3
        assert state_of(serve, B) is None
        assert serve.node_status()["prefetch"] == {"started": 0, "completed": 0, "failed": 0, "used": 0, "wasted": 0}
        predict(A, 1)  # addk_2 follows: it is loaded in the background, addk_3 (idle, colder) making room
        wait_until(lambda: state_of(serve, B) == "available", 60, "addk_2 to be prefetched")
        assert state_of(serve, C) is None
        assert serve.node_status()["prefetch"]["completed"] == 1
        predict(B, 2)  # served by the prefetched load
    counts = serve.node_status()["prefetch"]
    assert counts == {"started": 1, "completed": 1, "failed": 0, "used": 1, "wasted": 0}
    scrape = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10).text
    assert 'tfscache_prefetch_loads_total{node="node0",outcome="used"} 1.0' in scrape

    rows = wait_for_log_rows(serve.request_log, 8)
    assert [(r["model"], r["cold"], r["prefetched"]) for r in rows[-2:]] == [(A, "0", "0"), (B, "0", "1")]
