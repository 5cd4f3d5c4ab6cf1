"""Host-tier nodes with ``--backend mlserver`` (docs/tiers.md, "Host-tier nodes"): MLServer has
no instance groups, so a model leaves its GPU-tier node for a host-tier node.

One real ``tfscache serve --backend mlserver --local-nodes 1 --local-host-nodes 1`` (two
``mlserver start`` children, one model each at most), ``cache.demote = host``, no promotion by
rate (a horizon of a millisecond). This machine has no GPU: node0's count cap stands in for its
GPU memory. What each node holds is read from its own repository index, never from tfscache's
word; the client is the official tritonclient.
"""

from __future__ import annotations

import pytest
import tritonclient.grpc as tritongrpc

from support.mlserver import PATIENT, mlserver_infer, resident_models, serve_nodes
from support.serving import start_serve
from support.waiting import wait_until


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-host-tier"), mlserver_repository,
                     "--backend", "mlserver", "--local-nodes", "1", "--local-host-nodes", "1",
                     "--node-command", mlserver_bin, "--max-models-per-node", "1",
                     "--set", "cache.demote=host", "--set", "cache.promote_horizon_s=0.001",
                     *PATIENT) as process:
        yield process


def test_a_victim_moves_to_the_host_tier_node_and_answers_there(serve):
    nodes = serve_nodes(serve)
    node0, host0 = (f"http://127.0.0.1:{nodes[n]['rest']}" for n in ("node0", "host0"))
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    try:
        assert mlserver_infer(tritongrpc, client, "addk_1", 5.0) == [6.0]
        assert resident_models(node0) == {"addk_1"} and not resident_models(host0)
        assert mlserver_infer(tritongrpc, client, "addk_2", 5.0) == [7.0]
        # addk_1 was loaded on host0 before node0 let it go; addk_2 took its room
        assert resident_models(host0) == {"addk_1"}
        wait_until(lambda: resident_models(node0) == {"addk_2"}, 60, "node0 to hold addk_2 alone")
        assert mlserver_infer(tritongrpc, client, "addk_1", 1.0) == [2.0]  # from host0
        assert resident_models(node0) == {"addk_2"}  # no cold load on node0
    finally:
        client.close()
