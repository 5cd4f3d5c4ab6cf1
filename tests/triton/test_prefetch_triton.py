"""Co-access prefetch on a real tritonserver, through ``tfscache serve --backend triton``: once
addk_2 is learned to follow addk_1, a cold request for addk_1 loads addk_2 beside it (Triton loads
each model by its own call), so addk_2's request, sent after addk_1's answer, finds it loaded.
The client is tritonclient.grpc; what loaded is read from /status and the request log. That
addk_2's load starts with addk_1's and that addk_1 is answered without waiting for it is shown
deterministically, with loads held on events, in tests/cache/test_prefetch_cache.py."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tritongrpc

from support.serving import start_serve, wait_for_log_rows
from support.waiting import wait_until

A, B, C, D = "addk_1", "addk_2", "addk_3", "addk_4"


@pytest.fixture(scope="module")
def serve(tmp_path_factory, triton_repository):
    directory = tmp_path_factory.mktemp("prefetch-triton")
    with start_serve(directory, triton_repository, "--backend", "triton", "--local-nodes", "1",
                     "--max-models-per-node", "2", "--metrics-port", "0",
                     "--request-log", str(directory / "requests.csv"), "--set", "cache.prefetch=true",
                     "--set", "cache.prefetch_window_s=30", "--set", "cache.policy=lru") as process:
        process.request_log = directory / "requests.csv"
        yield process


def resident(serve) -> dict[str, str]:
    return {m["name"]: m["state"] for m in serve.node_status()["models"]}


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
        assert serve.node_status()["prefetch"]["started"] == 0
        infer(A, 1)  # cold: addk_2, its likely follower, loads beside it (addk_3, addk_4 idle, colder)
        wait_until(lambda: resident(serve).get(B) == "available", 60, "addk_2 to be loaded beside addk_1")
        assert set(resident(serve)) == {A, B}
        infer(B, 2)  # the next stage: served by the prefetched load
    finally:
        client.close()
    assert serve.node_status()["prefetch"] == {"started": 1, "completed": 1, "failed": 0, "used": 1, "wasted": 0}

    rows = wait_for_log_rows(serve.request_log, 8)
    assert [(r["model"], r["cold"], r["prefetched"]) for r in rows[-2:]] == [(A, "1", "0"), (B, "0", "1")]
