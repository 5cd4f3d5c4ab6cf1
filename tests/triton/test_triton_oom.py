"""Out of memory on a Triton node is handled: room is made and the load or request is tried
once more; the client sees the answer or RESOURCE_EXHAUSTED naming the caps, never CUDA's text.

The model ``oom`` (support.models.triton.build_oom) fails its load, or a request, with
PyTorch's CUDA out-of-memory text while a file the test writes says memory is short (a count
of failures to come). It stands in for a device that runs out of memory: this machine has no
GPU, and the handling under test is tfscache's, which reads only the node's error text.
Idle ``addk`` models on the same node are what the cache can unload to make room.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from support.models.triton import build_addk, build_oom
from support.serving import start_serve
from support.triton import oip_infer, resident_models, serve_triton_nodes

IDLE = ["addk_1", "addk_2", "addk_3"]


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Path:
    """The prefix of the files that say memory is short: ``.load`` and ``.infer``."""
    return tmp_path_factory.mktemp("memory") / "short"


@pytest.fixture(scope="module")
def serve(tmp_path_factory, short):
    repository = tmp_path_factory.mktemp("oom-repository")
    for k in (1, 2, 3):
        build_addk(repository, k)
    for k, name in ((7, "oom"), (8, "oom_load"), (9, "oom_never"), (10, "oom_load_twice")):
        build_oom(repository, k, short.with_name(f"{name}-short"), name)
    with start_serve(tmp_path_factory.mktemp("serve"), repository, "--backend", "triton",
                     "--local-nodes", "1", "--max-models-per-node", "8",
                     "--metrics-port", "0") as serve:
        yield serve


def shortage(short: Path, model: str, what: str, times: int) -> None:
    Path(f"{short.with_name(f'{model}-short')}.{what}").write_text(str(times))


def node_target(serve) -> str:
    return f"127.0.0.1:{serve_triton_nodes(serve)['node0']['grpc']}"


def warm_idle(serve) -> None:
    for k, name in enumerate(IDLE, start=1):
        assert oip_infer(serve.grpc_target, name, 1.0) == [1.0 + k]


def evictions(serve, reason: str) -> float:
    text = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("tfscache_evictions_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def model_bytes(serve, name: str) -> int:
    [model] = [m for m in serve.node_status()["models"] if m["name"] == name]
    return model["bytes"]


def test_a_request_that_runs_out_of_memory_gets_room_and_its_answer(serve, short):
    assert oip_infer(serve.grpc_target, "oom", 1.0) == [8.0]  # loaded, answering
    warm_idle(serve)
    before, counted = evictions(serve, "out_of_memory"), model_bytes(serve, "oom")
    shortage(short, "oom", "infer", 1)  # the next request runs the device out of memory
    assert oip_infer(serve.grpc_target, "oom", 2.0) == [9.0]
    assert evictions(serve, "out_of_memory") >= before + 1
    assert set(IDLE) - resident_models(node_target(serve)), "no idle model was unloaded"
    assert "oom" in resident_models(node_target(serve))
    assert model_bytes(serve, "oom") > counted  # it is taken to need more from now on


def test_a_request_short_again_after_room_is_made_is_resource_exhausted(serve, short):
    assert oip_infer(serve.grpc_target, "oom_never", 1.0) == [10.0]
    warm_idle(serve)
    shortage(short, "oom_never", "infer", 2)  # short on the request and on its one retry
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    tensor = tritongrpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("oom_never", [tensor], client_timeout=60)
    finally:
        client.close()
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    text = refused.value.message()
    assert "Out of memory on node node0 running model oom_never version 1" in text, text
    assert "caps: max_models=8" in text and "held by" in text, text
    assert "CUDA" not in text, text
    assert oip_infer(serve.grpc_target, "oom_never", 1.0) == [10.0]  # memory back: it serves


def test_over_rest_the_same_is_a_429(serve, short):
    assert oip_infer(serve.grpc_target, "oom_never", 1.0) == [10.0]
    shortage(short, "oom_never", "infer", 2)
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    reply = requests.post(f"{serve.rest_url}/v2/models/oom_never/infer", json=body, timeout=60)
    assert reply.status_code == 429, reply.text
    assert "Out of memory on node node0" in reply.json()["error"]
    assert "CUDA" not in reply.text


def test_a_load_that_runs_out_of_memory_is_retried_after_room_is_made(serve, short):
    warm_idle(serve)
    shortage(short, "oom_load", "load", 1)  # its first load fails for want of memory
    assert oip_infer(serve.grpc_target, "oom_load", 1.0) == [9.0]
    log = serve.log_text()
    assert "out of memory loading oom_load version 1" in log


def test_a_load_short_twice_is_resource_exhausted(serve, short):
    warm_idle(serve)
    shortage(short, "oom_load_twice", "load", 2)  # short on its load and on the one retry
    with pytest.raises(InferenceServerException) as refused:
        oip_infer(serve.grpc_target, "oom_load_twice", 1.0)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    text = refused.value.message()
    assert "Out of memory on node node0 loading model oom_load_twice version 1" in text, text
    assert "after idle models were unloaded to make room" in text, text
    assert "CUDA" not in text, text
    assert "oom_load_twice" not in resident_models(node_target(serve))
    assert oip_infer(serve.grpc_target, "addk_1", 1.0) == [2.0]  # the node serves on
