"""Front-end fixtures.

* ``frontend_repo``: one model repository for the session (TF Serving's test models plus
  ``addk_0`` .. ``addk_7``, each computing y = x + k).
* ``nodes``: two real nodes, {"a": node, "b": node}, shared by a module, for the sidecar
  tests (support/sidecars.py); ``node.gate`` holds or fails that node's loads.
"""

from __future__ import annotations

import pytest

from cache.cache_support import Gate
from frontend.serving import link_repository
from support.node import started_nodes
from support.sidecars import EMPTY, NODE_FLAGS

ADDK = range(8)


@pytest.fixture(scope="session")
def frontend_repo(test_models, synthetic_models, tmp_path_factory):
    bases = [p for p in sorted(test_models.iterdir()) if p.is_dir()] + synthetic_models(ADDK)
    return link_repository(tmp_path_factory.mktemp("frontend") / "models", bases)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sidecar-nodes")
    gates = {name: Gate(directory / f"gate-{name}") for name in "ab"}  # hold a node's loads open
    for gate in gates.values():
        gate.dir.mkdir()
    with started_nodes(directory, [[*NODE_FLAGS, f"--load_gate_dir={gates[n].dir}"] for n in "ab"],
                       config=EMPTY) as (a, b):
        a.gate, b.gate = gates["a"], gates["b"]
        yield {"a": a, "b": b}
