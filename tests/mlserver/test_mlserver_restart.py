"""MLServer nodes that die under traffic: no request fails.

* Embedded: the ``mlserver start`` child is SIGKILLed (with its inference workers) while 6
  clients send requests; the supervisor starts it again (new ports: chosen again), the router
  waits for it within each request's deadline (docs/restarts.md), and the new cache loads the
  models again on their next requests. On both data planes: with ``--data-plane haproxy`` the
  warm requests go from HAProxy to MLServer, which sends those in flight at the kill again
  (docs/data-plane.md, "Nodes that fail").
* Sidecar: MLServer behind ``tfscache serve --node-address`` is killed and started again at the
  same address with nothing loaded. The first request for a model the cache holds as ready
  gets MLServer's NOT_FOUND "Model NAME with version  not found": the cache rechecks what the
  node still serves, loads what it lost once, and the request is sent again.
"""

from __future__ import annotations

import functools
import os
import signal

import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from support.dataplane import routed_by_key
from support.serving import start_serve
from support.mlserver import mlserver_infer, serve_nodes, start_mlserver
from support.process import started_together
from support.traffic import ClientLoop
from support.waiting import wait_until
from tfscache.dataplane import binary

MODELS = ["addk_1", "addk_2", "addk_3"]


class Traffic(ClientLoop):
    def __init__(self, target: str, clients: int = 6) -> None:
        super().__init__(MODELS, clients, timeout=180.0)
        self.target = target
        self.errors = (InferenceServerException, OSError)

    def client(self, worker: int) -> None:
        client = tritongrpc.InferenceServerClient(self.target)
        try:
            self.loop(worker, lambda name, x: mlserver_infer(tritongrpc, client, name, x, timeout=self.timeout))
        finally:
            client.close()


def check(traffic: Traffic, serve) -> None:
    """No failed request (each failure shown with its code and text), every answer right."""
    failed = [(name, exc.status(), exc.message()) if isinstance(exc, InferenceServerException) else (name, exc)
              for name, exc in traffic.failures()]
    assert not failed, (len(failed), traffic.done(), failed[:5], serve.log_text()[-3000:])
    traffic.check()


@pytest.fixture(scope="module")
def started(tmp_path_factory, mlserver_repository, mlserver_bin):
    """Each test's first process, started at once: "embedded", a serve with its own MLServer node, and
    "raw", the MLServer the sidecar test puts a serve in front of. Each test ends its own."""
    directory = tmp_path_factory.mktemp("restart")
    with started_together([
            functools.partial(start_serve, directory, mlserver_repository, "--backend", "mlserver",
                              "--local-nodes", "1", "--node-command", mlserver_bin),
            functools.partial(start_mlserver, directory / "first", mlserver_repository)]) as (embedded, raw):
        yield {"embedded": embedded, "raw": raw}


@pytest.fixture(scope="module")
def on_haproxy(tmp_path_factory, mlserver_repository, mlserver_bin):
    """A serve with its own MLServer node on the haproxy data plane."""
    if not binary.available():
        pytest.skip("haproxy >= 2.6 is not installed (scripts/test.sh installs it)")
    with start_serve(tmp_path_factory.mktemp("restart-haproxy"), mlserver_repository, "--backend",
                     "mlserver", "--local-nodes", "1", "--node-command", mlserver_bin,
                     "--data-plane", "haproxy") as serve:
        yield serve


@pytest.mark.parametrize("data_plane", ["python", "haproxy"])
def test_an_embedded_node_killed_under_traffic_fails_no_request(data_plane, started, request):
    serve = started["embedded"] if data_plane == "python" else request.getfixturevalue("on_haproxy")
    first = serve_nodes(serve)["node0"]
    with Traffic(serve.grpc_target) as traffic:
        wait_until(lambda: traffic.ok() >= 20, 180, "warm traffic")
        if data_plane == "haproxy":  # the warm requests go from HAProxy to MLServer
            before = sum(routed_by_key(serve).values())
            wait_until(lambda: sum(routed_by_key(serve).values()) >= before + 20, 60, "routed requests")
        os.killpg(first["pid"], signal.SIGKILL)  # mlserver and its workers, as the OOM killer might
        count = traffic.done()
        wait_until(lambda: serve_nodes(serve)["node0"]["pid"] != first["pid"], 180, "the node restarted")
        wait_until(lambda: traffic.done() >= count + 30, 240, "traffic after the restart")
    check(traffic, serve)
    assert "node0 (pid %d) exited" % first["pid"] in serve.log_text()


def test_mlserver_restarting_behind_a_sidecar_fails_no_request(started, tmp_path, mlserver_repository):
    node = started["raw"]
    restarted = None
    try:
        with start_serve(tmp_path, mlserver_repository, "--backend", "mlserver",
                         "--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}") as serve:
            with Traffic(serve.grpc_target) as traffic:
                wait_until(lambda: traffic.ok() >= 20, 180, "warm traffic")
                node.kill()
                count = traffic.done()
                restarted = start_mlserver(tmp_path / "second", mlserver_repository, ports=node.ports)
                wait_until(lambda: traffic.done() >= count + 30, 240, "traffic after the restart")
            check(traffic, serve)
            assert "lost" in serve.log_text()  # the cache found the restarted node without its models
    finally:
        node.stop()
        if restarted is not None:
            restarted.stop()
