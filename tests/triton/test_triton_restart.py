"""A tritonserver child killed (SIGKILL) under traffic, with one node: no request fails.

The supervisor restarts the node (new ports: Triton cannot bind port 0, so they are chosen
again); the router waits for it within each request's deadline (docs/restarts.md), and the
new cache loads the models again on their next requests. Besides the looping clients, one
request is deterministically inside the node when it dies: it asks for ``gate_10``, whose
execute() writes a marker and then waits for a release file the test writes only after the
restart. On both data planes: with ``--data-plane haproxy`` the looping clients' warm requests
go from HAProxy to tritonserver, and HAProxy sends those in flight at the kill again
(docs/data-plane.md, "Nodes that fail").
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as tritongrpc

from support.dataplane import routed_by_key
from support.serving import start_serve
from support.triton import OipTraffic, resident_models, serve_triton_nodes
from support.models.triton import build_addk, write_model
from support.waiting import wait_until
from tfscache.dataplane import binary

MODELS = ["addk_1", "addk_2", "addk_3", "addk_4"]
DATA_PLANES = ["python", pytest.param("haproxy", marks=pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"))]

# y = x + 10 once the release file exists; each execute() first leaves a marker behind.
_GATE_PY = '''\
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        open(os.path.join({gate!r}, "executing.%d" % os.getpid()), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join({gate!r}, "release")) and time.monotonic() < deadline:
            time.sleep(0.01)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x + np.float32(10)).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
'''


def stubs_of(server_pid: int) -> list[int]:
    """PIDs of python-backend stubs started by tritonserver ``server_pid`` (it is in their argv)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            argv = process.info["cmdline"] or []
        except psutil.Error:
            continue
        if argv and argv[0].endswith("triton_python_backend_stub") and str(server_pid) in argv[1:]:
            found.append(process.pid)
    return found


@pytest.fixture(scope="module", params=DATA_PLANES)
def one_node(request, tmp_path_factory):
    """A serve with one tritonserver on ``request.param``'s data plane, and its gate directory."""
    gate = tmp_path_factory.mktemp("gate")
    repository = tmp_path_factory.mktemp("restart-repository")
    for k in range(1, 5):
        build_addk(repository, k)
    write_model(repository, "gate_10", _GATE_PY.format(gate=str(gate)), {})
    with start_serve(tmp_path_factory.mktemp("restart-serve"), repository, "--backend", "triton",
                     "--local-nodes", "1", "--max-models-per-node", "5",
                     "--data-plane", request.param) as serve:
        serve.data_plane = request.param
        yield serve, gate


def test_a_triton_node_killed_under_traffic_fails_no_request(one_node):
    serve, gate = one_node
    old = serve_triton_nodes(serve)["node0"]
    gated: list[object] = []

    def gated_request() -> None:
        client = tritongrpc.InferenceServerClient(serve.grpc_target)
        tensor = tritongrpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([5.0], dtype=np.float32))
        try:
            gated.append(client.infer("gate_10", [tensor], client_timeout=120).as_numpy("y").tolist())
        except Exception as exc:  # noqa: BLE001 - recorded, asserted below
            gated.append(exc)
        finally:
            client.close()

    with OipTraffic(serve.grpc_target, f"127.0.0.1:{serve.rest_port}", MODELS, clients=8,
                    timeout=120.0) as traffic:
        wait_until(lambda: traffic.ok() >= 40, 120, "warm traffic")
        assert resident_models(f"127.0.0.1:{old['grpc']}") == set(MODELS)
        if serve.data_plane == "haproxy":  # the looping requests go from HAProxy to tritonserver
            before = sum(routed_by_key(serve).values())
            wait_until(lambda: sum(routed_by_key(serve).values()) >= before + 40, 60, "routed requests")
        thread = threading.Thread(target=gated_request)
        thread.start()
        wait_until(lambda: list(gate.glob("executing.*")), 120, "the gated request inside the node")
        first_stub = {p.name for p in gate.glob("executing.*")}
        os.kill(old["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(lambda: serve_triton_nodes(serve)["node0"]["pid"] != old["pid"], 120,
                   "the node's restart")
        restarted_at = time.monotonic()
        (gate / "release").touch()
        thread.join(120)
        count = traffic.done()
        wait_until(lambda: traffic.done() >= count + 80, 120, "traffic after the restart")
    new = serve_triton_nodes(serve)["node0"]
    traffic.check()
    # The request inside the dead node was sent again to the restarted one (a new stub ran it).
    assert gated == [[15.0]], gated
    assert {p.name for p in gate.glob("executing.*")} - first_stub, "the gated request never ran again"
    in_flight = [r for r in traffic.results if r[3] < killed_at < r[4]]
    assert resident_models(f"127.0.0.1:{new['grpc']}") == {*MODELS, "gate_10"}  # loaded again on demand
    assert f"node0 (pid {old['pid']}) exited with -9; restarting it" in serve.log_text()
    # The killed server's model stubs (one process per loaded model) do not outlive it. (They
    # are in its process group: tritonserver was started as a session leader.)
    try:
        wait_until(lambda: not stubs_of(old["pid"]), 30, "the killed node's stubs to exit")
    finally:
        left = stubs_of(old["pid"])
        for pid in left:  # this test's own leftovers, by pid
            os.kill(pid, signal.SIGKILL)
        assert not left, f"stubs of the killed tritonserver {old['pid']} still running: {left}"
    assert len(stubs_of(new["pid"])) == len(MODELS) + 1
    slowest = max(r[4] - r[3] for r in traffic.results)
    print(f"restart took {restarted_at - killed_at:.2f} s; {len(in_flight)} looping requests in flight at the "
          f"kill; slowest request {slowest:.2f} s; {len(traffic.results)} requests; ports {old} -> {new}")
