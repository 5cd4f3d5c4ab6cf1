"""Pins and drain behave for Triton nodes as for TF Serving: the same cache, the same admin API.

A pinned model stays loaded on its Triton node through churn past the cap, read from the
node's own repository index; a drained node unloads every model, pinned or not.
"""

from __future__ import annotations

import subprocess

import pytest

from support.admin import start_admin_serve
from support.node import PYTHON
from support.triton import oip_infer, resident_models, serve_triton_nodes
from tfscache.cluster.ring import Ring


@pytest.fixture(scope="module")
def serve(triton_repository, tmp_path_factory):
    with start_admin_serve(tmp_path_factory.mktemp("triton-admin"), triton_repository, "--backend", "triton",
                           "--local-nodes", "2", "--max-models-per-node", "2") as process:
        yield process


def admin(serve, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", *args, "--address", serve.admin_target],
                          capture_output=True, text=True, timeout=120)


def test_a_pinned_model_stays_on_its_triton_node_and_a_drain_unloads_all(serve):
    home = Ring(["node0", "node1"]).owner("addk_1")
    target = f"127.0.0.1:{serve_triton_nodes(serve)[home]['grpc']}"
    pinned = admin(serve, "pin", "addk_1")
    assert pinned.returncode == 0, pinned.stderr
    others = [k for k in range(2, 13) if Ring(["node0", "node1"]).owner(f"addk_{k}") == home][:4]
    assert len(others) >= 3
    for k in others + others:  # churn through the one room the pin leaves on its node
        assert oip_infer(serve.grpc_target, f"addk_{k}", 1.0) == [1.0 + k]
        assert "addk_1" in resident_models(target) and len(resident_models(target)) <= 2
    drained = admin(serve, "drain", "--node", home)
    assert drained.returncode == 0, drained.stderr
    assert resident_models(target) == set()
