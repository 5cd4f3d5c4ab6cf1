"""Nodes that die: restarted by serve, and with 2 replicas per model no request is lost."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import psutil
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import start_serve
from support.requests import predict_request
from support.waiting import wait_until
from tfscache.cluster.ring import Ring

MODELS = [f"addk_{k}" for k in range(1, 7)]


@pytest.fixture(scope="module")
def serve(frontend_repo, tmp_path_factory):
    # Nodes exec'd, not forked from the node template: the node's absence must last the seconds of a
    # real model server's restart (TensorFlow's start), long enough to see the replica serve meanwhile.
    with start_serve(tmp_path_factory.mktemp("failover"), frontend_repo, "--local-nodes", "2",
                     "--replicas-per-model", "2", "--set", "node.fork_nodes=false") as process:
        yield process


def test_node_killed_during_traffic_loses_no_request(serve):
    ring = Ring(["node0", "node1"], replicas=2)
    victim = "node0"
    homed = [m for m in MODELS if ring.owner(m) == victim]
    assert homed, "some model must live on the victim first"
    old_pid = serve.node_ports(victim)["pid"]
    stop = threading.Event()
    results: list[tuple[str, float, object]] = []
    times: list[tuple[float, float]] = []  # (start, end) of each result
    lock = threading.Lock()
    counts = {"ok": 0}

    def client(worker: int) -> None:
        with grpc.insecure_channel(serve.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            i = 0
            while not stop.is_set():
                name, x = MODELS[(worker + i) % len(MODELS)], float(i)
                i += 1
                start = time.monotonic()
                try:
                    y = list(stub.Predict(predict_request(name, x), timeout=60).outputs["y"].float_val)
                except grpc.RpcError as exc:
                    y = exc
                with lock:
                    results.append((name, x, y))
                    times.append((start, time.monotonic()))
                    counts["ok"] += not isinstance(y, grpc.RpcError)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: counts["ok"] >= 40, 120, "warm traffic", interval=0.05)
        os.kill(old_pid, signal.SIGKILL)
        killed_at, killed_time = len(results), time.monotonic()
        # The supervisor restarts the node (a new pid in its ports file), traffic goes on.
        wait_until(lambda: serve.node_ports(victim).get("pid", old_pid) != old_pid, 120,
                   "the node's restart", interval=0.05)
        restarted_time = time.monotonic()
        wait_until(lambda: len(results) >= killed_at + 80, 120, "traffic after the restart",
                   interval=0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    failures = [(name, y) for name, _, y in results if isinstance(y, grpc.RpcError)]
    assert not failures, failures[:5]
    for name, x, y in results:
        assert y == [x + int(name.split("_")[1])]
    assert len(results) > killed_at
    # No request waited for the restart: the other replica served the victim's models meanwhile.
    # Requests sent in the first half of the node's absence (it lasts seconds: TensorFlow's start)
    # were all answered before it was back.
    half = killed_time + (restarted_time - killed_time) / 2
    sent = [(name, end) for (name, _, _), (start, end) in zip(results, times) if killed_time < start < half]
    assert {name for name, _ in sent} & set(homed), "the victim's models were requested while it was down"
    assert all(end < restarted_time for _, end in sent), [end - restarted_time for _, end in sent]
    serve.wait_for_log(r"node0 \(pid \d+\) exited with -9; restarting it")


def test_nodes_die_with_serve_even_when_it_is_killed(serve):
    """Runs last in this module: SIGKILL gives serve no chance to clean up; PR_SET_PDEATHSIG must."""
    pids = [serve.node_ports(name)["pid"] for name in ("node0", "node1")]
    nodes = [psutil.Process(pid) for pid in pids]
    serve.process.kill()
    serve.process.wait()
    gone, alive = psutil.wait_procs(nodes, timeout=60)
    assert not alive, alive
