"""Triton restarted behind a tfscache sidecar, at the same address: no request fails.

The restarted Triton has nothing loaded. The first request for a model the cache holds as
READY gets Triton's NOT_FOUND "Request for unknown model: ..."; the cache rechecks what
the node still serves, loads what it lost once, and the request is sent again. Requests
that meet the node while it is down wait for it (docs/restarts.md).
"""

from __future__ import annotations

import threading

import numpy as np
import tritonclient.grpc as triton_grpc

from support.serving import start_serve
from support.triton import oip_infer, start_triton
from support.waiting import wait_until

MODELS = ["addk_1", "addk_2", "addk_3"]


def test_triton_restarting_behind_a_sidecar_fails_no_request(triton_repository, tmp_path):
    node = start_triton(tmp_path / "first", triton_repository)
    ports = {"grpc": node.grpc_port, "rest": node.rest_port, "metrics": node.metrics_port}
    restarted = None
    results: list[object] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(serve, worker: int) -> None:
        c = triton_grpc.InferenceServerClient(serve.grpc_target)
        i = 0
        while not stop.is_set():
            name, x = MODELS[(worker + i) % len(MODELS)], float(worker * 1000 + i)
            i += 1
            tensor = triton_grpc.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
            try:
                y = c.infer(name, [tensor], client_timeout=60).as_numpy("y").tolist()
                result = None if y == [x + int(name.split("_")[1])] else AssertionError((name, x, y))
            except Exception as exc:  # noqa: BLE001 - every failure is collected and reported
                result = exc
            with lock:
                results.append(result)
        c.close()

    try:
        with start_serve(tmp_path, triton_repository, "--backend", "triton",
                         "--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}") as serve:
            threads = [threading.Thread(target=client, args=(serve, w)) for w in range(6)]
            for thread in threads:
                thread.start()
            try:
                wait_until(lambda: sum(r is None for r in results) >= 60, 120, "warm traffic")
                node.kill()
                count = len(results)
                restarted = start_triton(tmp_path / "second", triton_repository, ports=ports)
                wait_until(lambda: len(results) >= count + 120, 120, "traffic after the restart")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(120)
        failures = [r for r in results if r is not None]
        assert not failures, f"{len(failures)} of {len(results)} failed: {failures[:3]}"
        log = restarted.log_text()
        for name in MODELS:  # each lost model loaded once on the restarted node
            assert log.count(f"successfully loaded '{name}'") == 1, log[-3000:]
    finally:
        node.kill()
        if restarted is not None:
            restarted.stop()


def test_a_restarted_sidecar_readopts_what_triton_serves(triton_repository, tmp_path):
    state = tmp_path / "sidecar-state"
    with start_triton(tmp_path / "node", triton_repository) as node:
        args = ("--backend", "triton", "--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}",
                "--set", f"node.state_dir={state}")

        first = start_serve(tmp_path, triton_repository, *args)
        try:
            assert oip_infer(first.grpc_target, "addk_1", 1.0) == [2.0] and oip_infer(first.grpc_target, "addk_2", 1.0) == [3.0]
            first.process.kill()
            first.process.wait()
        finally:
            first.stop()
        with start_serve(tmp_path, triton_repository, *args) as second:
            assert oip_infer(second.grpc_target, "addk_1", 5.0) == [6.0] and oip_infer(second.grpc_target, "addk_2", 5.0) == [7.0]
            assert "adopted 2 models" in second.log_path.read_text()
        log = node.log_text()
        for name in ("addk_1", "addk_2"):  # adopted, not loaded again
            assert log.count(f"successfully loaded '{name}'") == 1, log[-3000:]
