"""A sidecar started before its TF Serving listens (issue 10, item 4).

In a pod both containers start together, so `tfscache serve --node-address` must not
exit when its node does not answer yet: it serves its front end at once with gRPC
health NOT_SERVING, requests wait for the node, and only after ``node.start_timeout_s``
without an answer does it give up (exit status 1, the reason in its log).

Real processes: `tfscache serve --node-address 127.0.0.1:G,R` (static discovery, alone on
its ring) and, later, `tfscache node` on exactly that address.
"""

from __future__ import annotations

import concurrent.futures
import socket

import grpc
from grpc_health.v1 import health_pb2
import pytest
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.admin import health_check
from support.serving import start_serve
from support.node import start_node
from support.requests import predict_request
from support.sidecars import EMPTY, NODE_FLAGS
from support.waiting import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def unused_port() -> int:
    """A port nothing listens on right now.

    Our own servers never bind-close-reuse a port (they bind port 0 and report it).
    Here the sidecar must be told its node's address before the node exists, and the node
    must then listen on exactly that address, as TF Serving does in a pod; so the port is
    chosen up front. The race (another process taking it meanwhile) is the price.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_sidecar_waits_for_a_node_that_is_not_listening_yet(frontend_repo, tmp_path):
    grpc_port, rest_port = unused_port(), unused_port()
    with start_serve(tmp_path, frontend_repo, "--node-address", f"127.0.0.1:{grpc_port},{rest_port}") as serve:
        # Its front end serves (the ports file is written once it does), but it is not ready.
        assert health_check(serve.grpc_target) == NOT_SERVING
        with grpc.insecure_channel(serve.grpc_target) as channel, \
                concurrent.futures.ThreadPoolExecutor(1) as pool:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            waiting = pool.submit(stub.Predict, predict_request("addk_1", 5.0), timeout=60)
            # Nothing happens while there is no node: the request neither fails nor returns.
            with pytest.raises(concurrent.futures.TimeoutError):
                waiting.result(timeout=1.0)
            assert serve.returncode is None
            assert health_check(serve.grpc_target) == NOT_SERVING
            with start_node(tmp_path, config=EMPTY,
                            flags=[*NODE_FLAGS, f"--port={grpc_port}", f"--rest_api_port={rest_port}"]) as node:
                assert (node.grpc_port, node.rest_port) == (grpc_port, rest_port)
                response = waiting.result(timeout=90)
                assert (response.model_spec.name, list(response.outputs["y"].float_val)) == ("addk_1", [6.0])
                wait_until(lambda: health_check(serve.grpc_target) == SERVING, 60, "health SERVING")
                # Later requests, REST included, go to the node too.
                assert list(stub.Predict(predict_request("addk_1", 1.0), timeout=60).outputs["y"].float_val) == [2.0]
                reply = requests.post(f"{serve.rest_url}/v1/models/addk_1:predict", json={"instances": [1.0]},
                                      timeout=60)
                assert (reply.status_code, reply.json()) == (200, {"predictions": [2.0]})
                assert serve.returncode is None
    assert "cannot go on" not in serve.log_text()


def test_a_sidecar_whose_node_never_answers_exits_1_after_start_timeout(frontend_repo, tmp_path):
    grpc_port, rest_port = unused_port(), unused_port()
    with start_serve(tmp_path, frontend_repo, "--node-address", f"127.0.0.1:{grpc_port},{rest_port}",
                     "--set", "node.start_timeout_s=2") as serve:
        # Its front end serves meanwhile; 2 s later it gives up (60 s is ample for that).
        try:
            wait_until(lambda: serve.returncode is not None, 60, "serve to exit after node.start_timeout_s")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log:\n{serve.log_text()[-3000:]}") from None
        assert serve.returncode == 1
    assert (f"tfscache serve cannot go on: node 127.0.0.1:{grpc_port} did not answer within "
            f"node.start_timeout_s = 2.0 s") in serve.log_text()
