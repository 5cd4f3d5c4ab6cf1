"""``tfscache serve --backend mlserver --workers 2``: the third node kind behind worker processes.

The same churn as test_serve_mlserver.py (16 tritonclient gRPC and HTTP clients over four models,
room for two on the node), through two worker processes that share the public ports: no request
fails, the node's own index never shows three resident, and models came and went.
"""

from __future__ import annotations

import pytest

from frontend.serving import start_serve
from support.mlserver import PATIENT, IndexSampler, index_states, serve_nodes
from support.waiting import wait_until

from .test_serve_mlserver import Churn


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-workers"), mlserver_repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", mlserver_bin, "--max-models-per-node", "2",
                     "--workers", "2", *PATIENT) as process:
        yield process


def test_churn_through_two_workers_fails_nothing_and_the_cap_holds(serve):
    node_url = f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"
    models = ["addk_1", "addk_2", "addk_3", "addk_4"]
    with IndexSampler({"node0": node_url}) as sampler:
        with Churn(serve, models) as churn:
            wait_until(lambda: churn.done() >= 200 or churn.failures(), 600, "200 requests of churn")
    churn.check()
    assert churn.done() >= 200
    assert sampler.count() > 0 and sampler.errors == 0
    assert sampler.peak("node0") <= 2, [s for s in sampler.samples["node0"] if len(s) > 2][:3]
    seen = [frozenset(s) for s in sampler.samples["node0"] if s]
    assert sum(1 for a, b in zip(seen, seen[1:]) if a != b) >= 2  # models came and went
    assert set(index_states(node_url)) >= set(models)
