"""``tfscache serve --backend mlserver --workers 2``: the third node kind behind worker processes.

The same churn as test_serve_mlserver.py (16 tritonclient gRPC and HTTP clients over four models,
room for two on the node), through two worker processes that share the public ports: no request
fails, the node's own index never shows three resident, and models came and went.
"""

from __future__ import annotations

import pytest

from support.serving import start_serve
from support.mlserver import PATIENT, serve_nodes

from .test_serve_mlserver import churn_holds_the_cap


@pytest.fixture(scope="module")
def serve(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("mlserver-workers"), mlserver_repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", mlserver_bin, "--max-models-per-node", "2",
                     "--workers", "2", *PATIENT) as process:
        yield process


def test_churn_through_two_workers_fails_nothing_and_the_cap_holds(serve):
    churn_holds_the_cap(serve, f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}")
