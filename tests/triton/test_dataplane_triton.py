"""``tfscache serve --backend triton --data-plane haproxy``: the Open Inference Protocol's hot
method routed by real HAProxy straight to a real tritonserver node, everything else through the
front end behind it, each answer as raw Triton's (docs/data-plane.md).

What HAProxy routed is read from its own stick table, over the serve's runtime socket
(support.dataplane). The clients are the official ``tritonclient.grpc`` and ``tritonclient.http``.
"""

from __future__ import annotations


import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc
from support.dataplane import dataplane_dir, runtime_command
from support.oip import client_pairs
from support.waiting import wait_until
from tritonclient.utils import InferenceServerException

from tfscache.dataplane import binary

pytestmark = pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")

SERVE_ARGS = ("--local-nodes", "1", "--data-plane", "haproxy")  # conftest's ``served``
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
IDENTITY = {"Accept-Encoding": "identity"}


@pytest.fixture(scope="module")
def serve(served):
    return served[0]


@pytest.fixture(scope="module")
def clients(serve, triton):
    with client_pairs(serve, triton) as made:
        yield made


@pytest.fixture(scope="module")
def runtime(serve):
    """One command on the serve's HAProxy runtime socket -> its answer."""
    def command(line: str) -> str:
        return runtime_command(serve, line)

    command.map = dataplane_dir(serve) / "routes.map"
    return command


def routed_requests(runtime, model: str) -> int:
    for line in runtime("show table inflight").splitlines():
        if f"key={model}@" in line:
            return int(line.rsplit("http_req_cnt=", 1)[1].split()[0])
    return 0


def infer(client, name: str, values, version: str = "") -> list[float]:
    tensor = tritongrpc.InferInput("x", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return client.infer(name, [tensor], model_version=version,
                        client_timeout=120).as_numpy("y").tolist()


def rest_infer(serve, name: str, value: float, path: str = "") -> list[float]:
    reply = requests.post(f"{serve.rest_url}/v2/models/{name}{path}/infer", timeout=60,
                          headers=IDENTITY, json={"inputs": [
                              {"name": "x", "shape": [1], "datatype": "FP32", "data": [value]}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"][0]["data"]


def test_model_infer_is_routed_by_haproxy_once_warm(serve, clients, runtime):
    tfs = clients["tfs"][0]
    assert infer(tfs, "addk_3", [1.0]) == [4.0]  # cold: the front end loads it
    wait_until(lambda: "addk_3" in runtime(f"show map {runtime.map}"), 30, "addk_3 routed")
    before = routed_requests(runtime, "addk_3")
    for x in range(5):
        assert infer(tfs, "addk_3", [float(x)]) == [x + 3.0]
        assert rest_infer(serve, "addk_3", float(x)) == [x + 3.0]
    assert routed_requests(runtime, "addk_3") == before + 10
    # a version named takes the slow path, and is answered there
    assert infer(tfs, "addk_3", [1.0], version="1") == [4.0]
    assert rest_infer(serve, "addk_3", 1.0, "/versions/1") == [4.0]
    assert routed_requests(runtime, "addk_3") == before + 10


def test_errors_are_raw_tritons_on_either_path(clients, runtime):
    """A wrong input name for a routed model (the node's answer, through HAProxy) and for an
    unknown model (the front end's), each as raw Triton answers it."""
    raw = clients["raw"][0]
    raw.load_model("addk_3")

    def wrong_input(client, model: str):
        tensor = tritongrpc.InferInput("nope", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, [tensor], client_timeout=60)
        return caught.value.status(), caught.value.message()

    assert infer(clients["tfs"][0], "addk_3", [1.0]) == [4.0]
    wait_until(lambda: "addk_3" in runtime(f"show map {runtime.map}"), 30, "addk_3 routed")
    for model in ("addk_3", "no_such_model"):
        assert wrong_input(clients["tfs"][0], model) == wrong_input(raw, model)


def _raw_call(target: str, body: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(INFER_PATH)  # no serializers: raw bytes both ways
        with pytest.raises(grpc.RpcError) as caught:
            call(body, timeout=30)
    return caught.value


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x0a\x05ab"])
def test_bytes_haproxy_cannot_parse_get_the_front_ends_error(serve, clients, garbage):
    error = _raw_call(serve.grpc_target, garbage)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Failed to parse request as inference.ModelInferRequest"
    assert infer(clients["tfs"][0], "addk_2", [1.0]) == [3.0]  # still serving


def test_a_routed_model_with_a_malformed_rest_gets_the_nodes_own_answer(serve, triton, clients,
                                                                       runtime):
    """HAProxy reads only the name: the rest goes to the node, which answers as raw Triton
    does (docs/data-plane.md)."""
    assert infer(clients["tfs"][0], "addk_3", [1.0]) == [4.0]
    wait_until(lambda: "addk_3" in runtime(f"show map {runtime.map}"), 30, "addk_3 routed")
    garbage = b"\x0a\x06addk_3\x12\xff"
    routed, raw = _raw_call(serve.grpc_target, garbage), _raw_call(triton.grpc_target, garbage)
    assert (routed.code(), routed.details()) == (raw.code(), raw.details())
    assert infer(clients["tfs"][0], "addk_2", [1.0]) == [3.0]  # still serving
