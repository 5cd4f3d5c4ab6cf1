"""Co-access prefetch on a real tritonserver, through ``tfscache serve --backend triton``: once
addk_2 is learned to follow addk_1, a cold request for addk_1 loads addk_2 beside it (Triton loads
each model by its own call), so addk_2's request, sent after addk_1's answer, finds it loaded.
The client is tritonclient.grpc; what loaded is read from /status and the request log. That
addk_2's load starts with addk_1's and that addk_1 is answered without waiting for it is shown
deterministically, with loads held on events, in tests/cache/test_prefetch_cache.py."""

from __future__ import annotations

import csv
import json
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc

from frontend.serving import start_serve

A, B, C, D = "addk_1", "addk_2", "addk_3", "addk_4"


@pytest.fixture(scope="module")
def serve(tmp_path_factory, triton_repository):
    directory = tmp_path_factory.mktemp("prefetch-triton")
    with start_serve(directory, triton_repository, "--backend", "triton", "--local-nodes", "1",
                     "--max-models-per-node", "2", "--metrics-port", "0",
                     "--request-log", str(directory / "requests.csv"), "--set", "cache.prefetch=true",
                     "--set", "cache.prefetch_window_s=30", "--set", "cache.policy=lru") as process:
        process.metrics_port = json.loads((process.directory / "ports.json").read_text())["metrics"]
        process.request_log = directory / "requests.csv"
        yield process


def node_status(serve) -> dict:
    reply = requests.get(f"http://127.0.0.1:{serve.metrics_port}/status", timeout=10)
    assert reply.status_code == 200
    return reply.json()["nodes"][0]


def resident(serve) -> dict[str, str]:
    return {m["name"]: m["state"] for m in node_status(serve)["models"]}


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline


def test_a_follower_loads_beside_its_cold_predecessor(serve):
    client = tritongrpc.InferenceServerClient(serve.grpc_target)

    def infer(name: str, k: int) -> None:
        tensor = tritongrpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        assert client.infer(name, [tensor], client_timeout=120).as_numpy("y").tolist() == [1.0 + k]

    try:
        for _ in range(2):  # the pipeline, twice: addk_2 follows addk_1
            infer(A, 1)
            infer(B, 2)
        infer(C, 3)  # two models fit: addk_1, then addk_2 make room for addk_3 and addk_4
        infer(D, 4)
        assert set(resident(serve)) == {C, D}
        assert node_status(serve)["prefetch"]["started"] == 0
        infer(A, 1)  # cold: addk_2, its likely follower, loads beside it (addk_3, addk_4 idle, colder)
        wait_for(lambda: resident(serve).get(B) == "available", "addk_2 to be loaded beside addk_1")
        assert set(resident(serve)) == {A, B}
        infer(B, 2)  # the next stage: served by the prefetched load
    finally:
        client.close()
    assert node_status(serve)["prefetch"] == {"started": 1, "completed": 1, "failed": 0, "used": 1, "wasted": 0}

    def logged() -> list[dict]:
        with open(serve.request_log, newline="") as f:
            return list(csv.DictReader(f))

    wait_for(lambda: len(logged()) == 8, "the request log's 8 rows")
    assert [(r["model"], r["cold"], r["prefetched"]) for r in logged()[-2:]] == [(A, "1", "0"), (B, "0", "1")]
