"""Streaming through ``tfscache serve --backend triton``: ModelStreamInfer, generate and
generate_stream, and statistics gathered from every node, against a raw tritonserver over the
same repository (conftest's ``triton``), with the unmodified tritonclient and plain HTTP.

* each streamed answer is compared with raw Triton's: order and number of responses, final
  flags, error texts; one client stream carries requests for several models;
* a client's cancellation and deadline (gRPC) and disconnection (REST) reach the model on
  the node;
* statistics through tfscache are the node's own when one node holds the model, the sum when
  two do.
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as tritongrpc

from support.triton import serve_triton_nodes
from support.waiting import wait_until

TIMEOUT = 120.0


SERVE_ARGS = ("--local-nodes", "1")  # conftest's ``served``


@pytest.fixture(scope="module")
def serve(served):
    return served[0]


@pytest.fixture(scope="module")
def raw(triton):
    """The raw tritonserver, with the models these tests compare loaded (it runs in explicit mode)."""
    client = tritongrpc.InferenceServerClient(triton.grpc_target)
    for model in ("stream_3", "stream_a", "sparse", "addk_2", "addk_3", "addk_4"):
        client.load_model(model)
    client.close()
    return triton


def x_input(values):
    tensor = tritongrpc.InferInput("x", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return tensor


def answer(result, error) -> tuple:
    """What a stream callback got, comparable across servers: (error text,) or (id, y, final)."""
    if error is not None:
        return ("error", error.message())
    response = result.get_response()
    final = response.parameters["triton_final_response"].bool_param
    outputs = result.as_numpy("y")
    return (response.id, response.model_name, None if outputs is None else outputs.tolist(), final)


class Stream:
    """One tritonclient gRPC stream; ``close()`` waits for the server to end it."""

    def __init__(self, target: str, timeout: float = TIMEOUT) -> None:
        self.client = tritongrpc.InferenceServerClient(target)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(lambda result, error: self.answers.put(answer(result, error)),
                                 stream_timeout=timeout)

    def send(self, model: str, values, request_id: str = "", version: str = "", empty_final: bool = False) -> None:
        self.client.async_stream_infer(model, [x_input(values)], model_version=version, request_id=request_id,
                                       enable_empty_final_response=empty_final)

    def next(self, timeout: float = TIMEOUT) -> tuple:
        return self.answers.get(timeout=timeout)

    def close(self, cancel: bool = False) -> list[tuple]:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
        return list(self.answers.queue)


# (model, x, version, enable_empty_final_response): each sent alone on a stream of its own.
CASES = [
    ("stream_3", [1.0, 2.0], "", False),  # 3 responses, no final flag on any
    ("stream_3", [1.0], "", True),  # 3 responses, then an empty one flagged final
    ("stream_3", [-5.0], "1", True),  # 5 responses
    ("sparse", [-1.0], "", False),  # no response at all
    ("sparse", [-1.0], "", True),  # only the empty final one
    ("sparse", [4.0], "", False),  # one
    ("addk_2", [1.0], "", False),  # not decoupled: one response, flagged final
    ("ghost", [1.0], "", False),  # unknown model: Triton's error text
    ("stream_3", [1.0], "2", False),  # unknown version
    ("stream_3", [1.0], "abc", False),  # a version that is not a number
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-v{c[2]}-{c[3]}" for c in CASES])
def test_each_stream_answers_as_raw_triton(serve, raw, case):
    model, values, version, empty_final = case
    answers = {}
    for name, target in (("raw", raw.grpc_target), ("tfs", serve.grpc_target)):
        stream = Stream(target)
        stream.send(model, values, request_id="r1", version=version, empty_final=empty_final)
        answers[name] = stream.close()
    assert answers["tfs"] == answers["raw"]
    if model == "stream_3" and version != "2" and version != "abc":
        assert len([a for a in answers["tfs"] if a[2] is not None]) == (5 if values[0] < 0 else 3)


def test_one_stream_carries_several_models(serve, raw):
    sends = [("stream_3", [1.0], "a"), ("sparse", [-1.0], "b"), ("addk_3", [1.0], "c"), ("stream_a", [10.0], "d"),
             ("sparse", [2.0], "e"), ("stream_3", [-2.0], "f")]
    grouped = {}
    for name, target in (("raw", raw.grpc_target), ("tfs", serve.grpc_target)):
        stream = Stream(target)
        for model, values, request_id in sends:
            stream.send(model, values, request_id=request_id, empty_final=True)
        by_id: dict[str, list] = {}
        for got in stream.close():
            by_id.setdefault(got[0], []).append(got)
        grouped[name] = by_id
    assert grouped["tfs"] == grouped["raw"]
    assert [len(grouped["tfs"][i]) for i in "abcdef"] == [4, 1, 1, 4, 2, 3]
    assert all(answers[-1][3] for answers in grouped["tfs"].values())  # each ends with its final flag


def test_cancelling_a_stream_reaches_the_model(serve, triton_markers: Path):
    stream = Stream(serve.grpc_target)
    stream.send("stream_b", [-400.0], request_id="cancel-grpc")  # 400 responses, 20 s
    first = stream.next()
    assert first[:2] == ("cancel-grpc", "stream_b"), first
    stream.close(cancel=True)
    wait_until(lambda: (triton_markers / "cancelled-cancel-grpc").exists(), 60, "the model to see the cancellation")
    # The lease went back: the model is idle on the node, and another request is served.
    stream = Stream(serve.grpc_target)
    stream.send("stream_b", [1.0], request_id="after", empty_final=True)
    assert len(stream.close()) == 4


def test_a_stream_deadline_reaches_the_model(serve, triton_markers: Path):
    # The client's deadline (stream_timeout), not a cancellation: the stream is never closed
    # by the client before the model has seen its request end. The model is loaded first, so
    # that the deadline falls while it streams, not while it loads.
    stream = Stream(serve.grpc_target)
    stream.send("stream_e", [1.0], request_id="before-deadline", empty_final=True)
    assert len(stream.close()) == 4
    stream = Stream(serve.grpc_target, timeout=3.0)
    try:
        stream.send("stream_e", [-400.0], request_id="deadline-grpc")  # 400 responses, 20 s
        assert stream.next()[:2] == ("deadline-grpc", "stream_e")
        while (got := stream.next())[0] != "error":
            assert got[:2] == ("deadline-grpc", "stream_e"), got
        assert "Deadline Exceeded" in got[1], got
        wait_until(lambda: (triton_markers / "cancelled-deadline-grpc").exists(), 60,
                   "the model to see the deadline")
    finally:
        stream.close()
    assert int((triton_markers / "cancelled-deadline-grpc").read_text()) < 399  # stopped early
    # The lease went back: another request is served.
    stream = Stream(serve.grpc_target)
    stream.send("stream_e", [1.0], request_id="after-deadline", empty_final=True)
    assert len(stream.close()) == 4


def test_generate_and_generate_stream_answer_as_raw_triton(serve, raw):
    urls = {"raw": raw.http_url, "tfs": serve.rest_url}
    cases = [("addk_4", "generate", {"x": [1.0]}), ("stream_3", "generate", {"x": [1.0]}),
             ("stream_3", "generate_stream", {"x": [1.0]}), ("stream_3", "generate_stream", {"x": [-4.0]}),
             ("sparse", "generate_stream", {"x": [-1.0]}), ("ghost", "generate_stream", {"x": [1.0]}),
             ("stream_3/versions/2", "generate", {"x": [1.0]}),
             ("addk_4/versions/2", "infer",
              {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}),
             ("stream_3/versions/2", "generate_stream", {"x": [1.0]})]
    for model, verb, body in cases:
        got = {}
        for name, url in urls.items():
            reply = requests.post(f"{url}/v2/models/{model}/{verb}", json=body, timeout=TIMEOUT,
                                  headers={"Accept-Encoding": "identity"})
            got[name] = (reply.status_code, reply.headers.get("Content-Type"), reply.text)
        assert got["tfs"] == got["raw"], (model, verb)
    status, content_type, text = got["tfs"]
    assert status == 404


def test_generate_stream_arrives_as_it_comes(serve):
    with requests.post(f"{serve.rest_url}/v2/models/stream_c/generate_stream", json={"x": [-3.0]}, stream=True,
                       timeout=TIMEOUT, headers={"Accept-Encoding": "identity"}) as reply:
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert events == [b'data: {"model_name":"stream_c","model_version":"1","y":%s}' % y for y in
                      (b"-3.0", b"-2.0", b"-1.0")]


def test_a_disconnected_generate_stream_stops_the_model(serve, triton_markers: Path):
    marker = triton_markers / "cancelled-rest-1"
    with requests.post(f"{serve.rest_url}/v2/models/stream_d/generate_stream", json={"id": "rest-1", "x": [-400.0]},
                       stream=True, timeout=TIMEOUT, headers={"Accept-Encoding": "identity"}) as reply:
        assert reply.status_code == 200
        assert next(reply.iter_lines()).startswith(b"data: ")
    wait_until(marker.exists, 60, "the model to see the client gone")


def test_statistics_are_the_nodes_own_with_one_node(serve):
    tfs = tritongrpc.InferenceServerClient(serve.grpc_target)
    node = tritongrpc.InferenceServerClient(f"127.0.0.1:{_node_grpc(serve)}")
    try:
        tfs.infer("addk_5", [x_input([1.0])], client_timeout=TIMEOUT)
        # Triton counts a request once its response is released, which may be just after the
        # client has it: wait for the node's own count, then the front end's answer is the node's.
        own = wait_until(lambda: counted(node.get_inference_statistics("addk_5", as_json=True), 1),
                         TIMEOUT, "the node to count the inference")
        assert tfs.get_inference_statistics("addk_5", as_json=True) == own
        rest = requests.get(f"{serve.rest_url}/v2/models/addk_5/stats", timeout=TIMEOUT).json()
        assert rest["model_stats"][0]["inference_count"] == 1
    finally:
        tfs.close()
        node.close()


def counted(answer: dict, count: int) -> dict | None:
    """``answer`` (ModelStatistics as tritonclient's JSON) once its one entry counts ``count``
    inferences, successes included (Triton updates both at once), else None."""
    (stats,) = answer["model_stats"]
    success = stats.get("inference_stats", {}).get("success", {})
    done = int(stats.get("inference_count", 0)) == count and int(success.get("count", 0)) == count
    return answer if done else None


def _node_grpc(serve) -> int:
    return serve_triton_nodes(serve)["node0"]["grpc"]
