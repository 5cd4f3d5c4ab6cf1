"""``tfscache serve --backend mlserver --data-plane haproxy``: the third node kind behind real
HAProxy (docs/data-plane.md).

The same churn as test_serve_mlserver.py (16 tritonclient gRPC and HTTP clients over four
models, room for two on the node): no request fails, the node's own index never shows three
resident, and HAProxy routed warm requests straight to the node, read from its own stick table.
The same hostile input as there gets the same answers: a request HAProxy cannot route, or one
over the size limit, goes to the front end, and a routed one with a bad tensor gets MLServer's
own error from the node.
"""

from __future__ import annotations


import pytest

from support.dataplane import routed_by_key
from support.mlserver import PATIENT, mlserver_infer, serve_nodes
from support.oip import client_pairs
from support.serving import start_serve
from support.waiting import wait_until
import tritonclient.grpc as tritongrpc

from tfscache.dataplane import binary

from .test_serve_mlserver import (LIMIT, churn_holds_the_cap,
                                  test_hostile_input_gets_clear_errors_and_the_server_keeps_serving
                                  as hostile_input_holds)

pytestmark = pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-dataplane"), mlserver_repository,
                     "--backend", "mlserver", "--local-nodes", "1", "--node-command", mlserver_bin,
                     "--max-models-per-node", "2", "--max-receive-message-size", str(LIMIT),
                     "--data-plane", "haproxy", *PATIENT) as process:
        yield process


@pytest.fixture(scope="module")
def clients(serve, mlserver):
    with client_pairs(serve, mlserver) as made:
        yield made


def routed_requests(serve) -> int:
    """Requests HAProxy's stick table counted, over every model: the routed ones."""
    return sum(routed_by_key(serve).values())


def routed_once_warm(serve, client, name: str) -> None:
    """Request ``name`` (cold: the front end loads it) until one request of it is routed."""
    before = routed_requests(serve)
    wait_until(lambda: (mlserver_infer(tritongrpc, client, name, 1.0) == [2.0]
                        and routed_requests(serve) > before), 30, f"{name} routed")


def test_a_warm_model_is_routed_by_haproxy(serve, clients):
    grpc_client, _ = clients["tfs"]
    routed_once_warm(serve, grpc_client, "addk_1")
    before = routed_requests(serve)
    for x in range(5):
        assert mlserver_infer(tritongrpc, grpc_client, "addk_1", float(x)) == [x + 1.0]
    assert routed_requests(serve) == before + 5


def test_churn_on_the_data_plane_fails_nothing_and_the_count_cap_holds(serve):
    before = routed_requests(serve)
    churn_holds_the_cap(serve, f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}")
    assert routed_requests(serve) > before  # warm requests went through HAProxy


def test_hostile_input_gets_the_python_data_plane_s_answers(serve, clients):
    routed_once_warm(serve, clients["tfs"][0], "addk_1")  # its bad tensors go to the node
    hostile_input_holds(serve, clients)
