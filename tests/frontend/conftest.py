"""Front-end fixtures.

* ``frontend_repo``: one model repository for the session (TF Serving's test models plus
  ``addk_0`` .. ``addk_7``, each computing y = x + k).
* ``nodes``: two real nodes, {"a": node, "b": node}, for the sidecar tests
  (support/sidecars.py); ``node.gate`` holds or fails that node's loads. The same two serve
  every module of the package (``two_nodes``), emptied for each: every gate cleared, an empty
  config (nothing aspired) and no model of ``frontend_repo`` resident, as a node just started.
"""

from __future__ import annotations

import grpc
import pytest
from support.cache import Gate
from support.node import started_nodes, version_status
from support.requests import reload_request
from support.sidecars import EMPTY, NODE_FLAGS
from support.waiting import wait_until
from tensorflow_serving.apis import model_service_pb2_grpc

from support.serving import link_repository

ADDK = range(8)


@pytest.fixture(scope="session")
def frontend_repo(test_models, synthetic_models, tmp_path_factory):
    bases = [p for p in sorted(test_models.iterdir()) if p.is_dir()] + synthetic_models(ADDK)
    return link_repository(tmp_path_factory.mktemp("frontend") / "models", bases)


RESIDENT = frozenset({10, 20, 30, 40})  # START, LOADING, AVAILABLE, UNLOADING


def emptied(node, names: list[str]) -> None:
    """``node`` with nothing aspired (an empty config) and none of ``names`` resident."""
    with grpc.insecure_channel(node.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        stub.HandleReloadConfigRequest(reload_request(EMPTY), timeout=60)
        wait_until(lambda: not [n for n in names if any(v.state in RESIDENT for v in version_status(stub, n))],
                   60, f"every model unloaded from {node.grpc_target}")


@pytest.fixture(scope="module")
def nodes(two_nodes, frontend_repo):
    names = sorted(p.name for p in frontend_repo.iterdir())  # the sidecar modules' models (labels: half_plus_two)
    for node in two_nodes.values():
        node.gate.clear()  # a load held or failed by a module before is let go
        emptied(node, names)
    return two_nodes


@pytest.fixture(scope="package")
def two_nodes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sidecar-nodes")
    gates = {name: Gate(directory / f"gate-{name}") for name in "ab"}  # hold a node's loads open
    for gate in gates.values():
        gate.dir.mkdir()
    with started_nodes(directory, [[*NODE_FLAGS, f"--load_gate_dir={gates[n].dir}"] for n in "ab"],
                       config=EMPTY) as (a, b):
        a.gate, b.gate = gates["a"], gates["b"]
        yield {"a": a, "b": b}
