"""Faults with `tfscache serve --workers 2`: a worker SIGKILLed under traffic is restarted and only
requests in flight on it may fail; the control process SIGKILLed takes every worker with it, and a
restart re-adopts what its node serves (sidecar mode: the node outlives it)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter

import grpc
import pytest
from support.serving import start_serve
from support.node import start_node
from support.requests import predict_request
from support.sidecars import EMPTY, NODE_FLAGS
from support.tfs_traffic import Traffic
from support.traffic import describe
from support.waiting import process_ended, wait_until
from tensorflow_serving.apis import prediction_service_pb2_grpc

from workers.conftest import worker_pids

MODELS = ["addk_1", "addk_2", "addk_3"]
CLIENTS = 16


def predict(target: str, name: str, x: float) -> list[float]:
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return list(stub.Predict(predict_request(name, x), timeout=60).outputs["y"].float_val)


@pytest.fixture(scope="module")
def serve(workers_repo, tmp_path_factory):
    with start_serve(tmp_path_factory.mktemp("faults"), workers_repo, "--workers", "2", "--local-nodes", "1") as serve:
        yield serve


def client(result) -> int:
    """The Traffic client that sent ``result`` (its x is ``client * 1000 + i``)."""
    return int(result[1] // 1000)


def answered_since(traffic, since: float) -> set[int]:
    """The clients answered by a request sent at or after ``since``."""
    return {client(r) for r in traffic.snapshot()
            if r[3] >= since and not isinstance(r[2], BaseException)}


def test_a_killed_worker_is_restarted_and_only_its_requests_fail(serve):
    before = worker_pids(serve.pid)
    assert len(before) == 2
    with Traffic(serve.grpc_target, serve.rest_url, MODELS, clients=CLIENTS, timeout=60.0) as traffic:
        wait_until(lambda: traffic.ok() >= 200, 120, "warm traffic")
        killed = time.monotonic()
        os.kill(before[0], signal.SIGKILL)
        wait_until(lambda: process_ended(before[0]), 30, "the killed worker to go")
        gone = time.monotonic()  # its sockets are closed: no connection can reach it from now on
        wait_until(lambda: len(worker_pids(serve.pid)) == 2, 60, "the worker's restart")
        after = worker_pids(serve.pid)
        count = len(traffic.results)
        wait_until(lambda: len(traffic.results) >= count + 300
                   and len(answered_since(traffic, gone)) == CLIENTS, 120,
                   "traffic after the restart, every client answered again")
    assert before[0] not in after and before[1] in after  # the other worker was untouched
    failures = [r for r in traffic.results if isinstance(r[2], BaseException)]
    rest = lambda r: client(r) % 4 == 3  # every fourth client uses REST (tfs_traffic)
    assert all(r[4] >= killed for r in failures)  # nothing failed before the kill
    # While the killed process exits, the kernel closes its sockets one by one: a connection that
    # reaches its listening socket (SO_REUSEPORT) before that closes is reset with it. So requests
    # in flight on it fail, and so may a client's next ones, sent into that window; none sent after
    # the process was gone fails over REST (a connection a request).
    assert all(r[3] < gone for r in failures if rest(r)), [
        (client(r), round(r[3] - gone, 3), "REST" if rest(r) else "gRPC") for r in failures]
    # A gRPC client's channel may send a request after ``gone`` on the connection it has not yet
    # seen end (it reads that in a thread of its own, on a loaded machine possibly late). And a
    # channel whose reconnect landed on the dying socket waits out its reconnect backoff (1 s at
    # first), failing every call meanwhile (no wait_for_ready): the test's gRPC clients share one
    # channel's connection (grpc's global subchannel pool): a loaded fresh-clone run saw 157 to
    # 303 such failures per client. They are all the channel's UNAVAILABLE, never another answer,
    # and they end: every client is answered again, and then fails no more (below).
    late = [r for r in failures if not rest(r) and r[3] >= gone]
    assert all(r[2].code() == grpc.StatusCode.UNAVAILABLE for r in late), Counter(
        (client(r), describe(r[2])[:120]) for r in late).most_common(5)
    # Once a client has had an answer after the process was gone, it is on a live worker for good.
    recovered = {}
    for r in sorted(traffic.results, key=lambda r: r[3]):
        if r[3] >= gone and not isinstance(r[2], BaseException):
            recovered.setdefault(client(r), r[3])
    assert len(recovered) == CLIENTS  # every client was answered again
    assert not [r for r in failures if r[3] > recovered[client(r)]]
    wrong = [(name, x, y) for name, x, y, _, _ in traffic.results
             if not isinstance(y, BaseException) and y != [x + float(name.rsplit("_", 1)[1])]]
    assert not wrong
    assert "worker 0 (pid" in serve.log_text() or "worker 1 (pid" in serve.log_text()  # said it restarted one
    assert predict(serve.grpc_target, "addk_1", 1.0) == [2.0]


def test_a_killed_node_fails_no_request_sent_warm_by_the_workers(serve):
    """Requests a worker sent straight to the node under its delegation when the node died are sent
    again through the control process, which waits for the node's restart (docs/restarts.md)."""
    old_pid = serve.node_ports("node0")["pid"]
    with Traffic(serve.grpc_target, serve.rest_url, MODELS, clients=CLIENTS, timeout=120.0) as traffic:
        wait_until(lambda: traffic.ok() >= 200, 120, "warm traffic")
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: serve.node_ports("node0").get("pid", old_pid) != old_pid, 120, "the node's restart")
        count = len(traffic.results)
        wait_until(lambda: len(traffic.results) >= count + 200, 120, "traffic after the restart")
    traffic.check()
    assert "delegated model addk_" in serve.log_text()


def test_a_killed_control_process_leaves_no_worker_and_a_restart_readopts(workers_repo, tmp_path):
    state = tmp_path / "sidecar-state"
    with start_node(tmp_path / "node", config=EMPTY, flags=NODE_FLAGS) as node:
        args = ("--workers", "2", "--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}",
                "--set", f"node.state_dir={state}")
        first = start_serve(tmp_path, workers_repo, *args)
        try:
            workers = worker_pids(first.pid)
            assert len(workers) == 2
            assert predict(first.grpc_target, "addk_1", 1.0) == [2.0]
            assert predict(first.grpc_target, "addk_2", 1.0) == [3.0]
            state_file = state / "local.cache.json"  # written after the load, coalesced: wait for it
            wait_until(lambda: state_file.exists() and "addk_2" in state_file.read_text(), 30, "the state file")
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            for pid in workers:  # no orphan: each worker died with it
                wait_until(lambda pid=pid: process_ended(pid), 30, f"worker {pid} to exit")
        finally:
            first.stop()
        with start_serve(tmp_path, workers_repo, *args) as second:
            assert predict(second.grpc_target, "addk_1", 5.0) == [6.0]
            assert predict(second.grpc_target, "addk_2", 5.0) == [7.0]
            assert "adopted 2 models" in second.log_text()
        log = node.log_text()
        for name in ("addk_1", "addk_2"):  # adopted, not loaded again
            assert log.count(f"loaded {name} version 1") == 1, log[-3000:]


@pytest.mark.asyncio(loop_scope="package")
async def test_a_worker_whose_channel_closes_exits_and_is_replaced(gate_app):
    """The second way a worker never outlives its control process: its channel closing (here closed
    by the control side while the process runs in this test: the package's ``gate_app``); the pool
    then starts a new one."""
    slot = gate_app.workers.workers[0]
    old = slot.process
    await slot.channel.close()
    assert await asyncio.wait_for(old.wait(), 30) == 0  # it exited on its own
    deadline = asyncio.get_running_loop().time() + 60
    while slot.process is old or not slot.ready.is_set():  # polling a condition with a deadline
        assert asyncio.get_running_loop().time() < deadline, "no new worker"
        await asyncio.sleep(0.05)
    result = await asyncio.to_thread(predict, gate_app.target, "addk_1", 1.0)
    assert result == [2.0]
