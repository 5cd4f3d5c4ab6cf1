"""Streams under cap pressure and node failure, through ``tfscache serve --backend triton`` with
two nodes capped at 2 models each, over the five decoupled stream models (conftest's
``STREAM_MODELS``, 3 responses ``STREAM_DELAY_MS`` apart).

* 16 clients, each on its own tritonclient gRPC stream, send requests for random stream
  models: every request gets its 3 responses and its final flag, in order (no stream was cut
  by an unload), none fails, and the cap holds at every instant in each node's own
  RepositoryIndex;
* statistics through tfscache are the sum over the nodes that hold the model;
* a node SIGKILLed while a request streams from it: the client gets an error naming the
  node's failure, the stream goes on serving, and the model serves again after the restart;
  the same for a REST generate_stream: its last event is the error, and its lease goes back
  (``/status``);
* a drain of a node waits for the request streaming from it: the stream is not cut.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as tritongrpc

from support.admin import start_admin_serve
from support.node import PYTHON
from support.triton import IndexSampler, resident_models, serve_triton_nodes
from support.waiting import wait_until

from .conftest import STREAM_MODELS
from .test_streaming import TIMEOUT, Stream, counted, x_input

CAP = 2
CLIENTS = 16
REQUESTS_PER_CLIENT = 6


@pytest.fixture(scope="module")
def capped(tmp_path_factory, triton_repository: Path):
    with start_admin_serve(tmp_path_factory.mktemp("stream-churn"), triton_repository, "--backend", "triton",
                     "--local-nodes", "2", "--max-models-per-node", str(CAP), "--metrics-port", "0") as serve:
        yield serve


def client_run(target: str, seed: int, results: list, failures: list) -> None:
    rng = random.Random(seed)
    stream = Stream(target)
    try:
        for n in range(REQUESTS_PER_CLIENT):
            model, x = rng.choice(STREAM_MODELS), float(rng.randrange(100))
            request_id = f"c{seed}-{n}"
            stream.send(model, [x], request_id=request_id, empty_final=True)
            got = [stream.next() for _ in range(4)]  # 3 responses and the empty final one
            expected = [(request_id, model, [x + i], False) for i in range(3)] + [(request_id, model, None, True)]
            (results if got == expected else failures).append((model, got))
    except Exception as exc:  # noqa: BLE001 - recorded, asserted by the test
        failures.append(("exception", repr(exc)))
    finally:
        stream.close()


def test_sixteen_streaming_clients_over_capped_nodes(capped):
    nodes = serve_triton_nodes(capped)
    targets = {name: f"127.0.0.1:{ports['grpc']}" for name, ports in nodes.items()}
    results: list = []
    failures: list = []
    with IndexSampler(targets) as sampler:
        threads = [threading.Thread(target=client_run, args=(capped.grpc_target, seed, results, failures))
                   for seed in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not failures, failures[:3]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    assert {model for model, _ in results} == set(STREAM_MODELS)
    for node in targets:
        assert sampler.peak(node) <= CAP, (node, [s for s in sampler.samples.get(node, []) if len(s) > CAP][:5])
    assert max(len(set().union(*sampler.samples.get(n, [set()]))) for n in targets) > CAP  # models churned
    assert sampler.errors == 0


def test_statistics_sum_every_node_that_holds_the_model(capped):
    nodes = serve_triton_nodes(capped)
    model = "addk_9"
    for name in nodes:  # both caches hold it
        preloaded = subprocess.run([PYTHON, "-m", "tfscache", "preload", model, "--node", name, "--address",
                                    capped.admin_target], capture_output=True, text=True, timeout=120)
        assert preloaded.returncode == 0, preloaded.stderr
    counts = {}
    for k, (name, ports) in enumerate(sorted(nodes.items())):  # 1 and 2 inferences on the nodes' own ports
        client = tritongrpc.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        for _ in range(k + 1):
            client.infer(model, [x_input([1.0])], client_timeout=TIMEOUT)
        # Triton counts a request once its response is released: wait for the node's own count.
        own = wait_until(lambda: counted(client.get_inference_statistics(model, as_json=True), k + 1),
                         TIMEOUT, f"node {name} to count {k + 1} inferences")
        counts[name] = own["model_stats"][0]
        client.close()
    tfs = tritongrpc.InferenceServerClient(capped.grpc_target)
    try:
        merged = tfs.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        tfs.close()
    rest = requests.get(f"{capped.rest_url}/v2/models/{model}/stats", timeout=TIMEOUT).json()["model_stats"]
    assert len(merged) == 1 and merged[0]["inference_count"] == "3", merged
    success = [int(c["inference_stats"]["success"]["ns"]) for c in counts.values()]
    assert merged[0]["inference_stats"]["success"] == {"count": "3", "ns": str(sum(success))}
    assert merged[0]["last_inference"] == max(c["last_inference"] for c in counts.values())
    assert rest[0]["inference_count"] == 3 and rest[0]["inference_stats"]["success"]["ns"] == sum(success)


def test_a_node_killed_mid_stream_ends_that_request_with_an_error(capped):
    nodes = serve_triton_nodes(capped)
    stream = Stream(capped.grpc_target)
    try:
        stream.send("stream_e", [-400.0], request_id="doomed")  # 400 responses, 20 s
        first = stream.next()
        assert first[:2] == ("doomed", "stream_e"), first
        pid = next(ports["pid"] for ports in nodes.values()
                   if "stream_e" in _resident(ports))
        os.kill(pid, signal.SIGKILL)
        while (got := stream.next())[0] != "error":
            assert got[:2] == ("doomed", "stream_e"), got
        assert "the node serving this request became unavailable after" in got[1], got
        # The client stream still serves: the model loads again on the restarted node.
        stream.send("stream_e", [1.0], request_id="after", empty_final=True)
        answers = [stream.next() for _ in range(4)]
        assert [a[2] for a in answers] == [[1.0], [2.0], [3.0], None], answers
    finally:
        stream.close()
    wait_until(lambda: all(n in serve_triton_nodes(capped) for n in nodes), 60, "both nodes serving")


def test_a_node_killed_mid_generate_stream_ends_it_with_an_error_event(capped):
    nodes = serve_triton_nodes(capped)
    model = "stream_c"
    url = f"{capped.rest_url}/v2/models/{model}/generate_stream"
    with requests.post(url, json={"id": "doomed-rest", "x": [-400.0]}, stream=True,  # 400 events, 20 s
                       timeout=TIMEOUT, headers={"Accept-Encoding": "identity"}) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        assert next(line for line in lines if line).startswith(b'data: {"id":"doomed-rest","model_name":"stream_c"')
        assert _leases(capped) == {model: 1}  # held while it streams
        pid = next(ports["pid"] for ports in nodes.values() if model in _resident(ports))
        os.kill(pid, signal.SIGKILL)
        events = [line for line in lines if line]  # the server ends the reply
    assert events, "no event after the kill"
    assert events[-1].startswith(b'data: {"error":"the node serving this request became unavailable after'), \
        events[-1]
    assert all(e.startswith(b'data: {"id":"doomed-rest","model_name":"stream_c"') for e in events[:-1]), events[-3:]
    wait_until(lambda: all(n in serve_triton_nodes(capped) for n in nodes), 60, "both nodes serving")
    wait_until(lambda: not _leases(capped), 60, "the lease to go back")
    # The model serves again (on the restarted node), and its lease goes back after.
    reply = requests.post(url, json={"x": [1.0]}, timeout=TIMEOUT, headers={"Accept-Encoding": "identity"})
    assert reply.status_code == 200 and [line for line in reply.iter_lines() if line] == [
        b'data: {"model_name":"stream_c","model_version":"1","y":%s}' % y for y in (b"1.0", b"2.0", b"3.0")]
    assert not _leases(capped)


def test_a_drain_waits_for_an_open_stream(capped):
    stream = Stream(capped.grpc_target)
    try:
        stream.send("stream_d", [-40.0], request_id="drained", empty_final=True)  # 40 responses, 2 s
        assert stream.next()[:3] == ("drained", "stream_d", [-40.0])
        node = next(name for name, ports in serve_triton_nodes(capped).items()
                    if "stream_d" in resident_models(f"127.0.0.1:{ports['grpc']}"))
        drained = subprocess.run([PYTHON, "-m", "tfscache", "drain", "--node", node, "--address",
                                  capped.admin_target], capture_output=True, text=True, timeout=120)
        assert drained.returncode == 0, drained.stderr
        # The drain unloaded every model of the node, yet the stream was not cut: all of it came.
        wait_until(lambda: stream.answers.qsize() >= 41 - 1, 60, "the rest of the stream")
        got = list(stream.answers.queue)
        assert [a[2] for a in got] == [[float(i)] for i in range(-39, 0)] + [None], got[-3:]
        assert got[-1][3] is True
    finally:
        stream.close()


def _leases(serve) -> dict[str, int]:
    """{model: leases} of the models with a lease on a local node, from ``/status``."""
    metrics = json.loads((serve.directory / "ports.json").read_text())["metrics"]
    document = requests.get(f"http://127.0.0.1:{metrics}/status", timeout=10).json()
    leases: dict[str, int] = {}
    for node in document["nodes"]:
        for m in node.get("models", []):
            if m["leases"]:
                leases[m["name"]] = leases.get(m["name"], 0) + m["leases"]
    return leases


def _resident(ports) -> set[str]:
    try:
        return resident_models(f"127.0.0.1:{ports['grpc']}")
    except Exception:  # noqa: BLE001 - a node not answering holds nothing we can use
        return set()

