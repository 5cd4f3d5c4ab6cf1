"""Fixtures for tests that run against each Open Inference Protocol kind (Triton, MLServer).

* ``kind`` (module, parametrized): "triton" or "mlserver"; the MLServer runs skip, naming
  scripts/install_mlserver.sh, where MLServer is not installed (tests/mlserver/conftest.py).
* ``raw`` (module): that kind's raw server (``grpc_target``), nothing loaded at start.
* ``cap_one`` (module): ``tfscache serve --backend KIND`` with one local node capped at one
  model, over the kind's test repository; for Triton, a module that uses it sets ``SERVE_ARGS``
  (tests/triton/conftest.py's ``served``) and ``raw`` is the tritonserver beside it.

The kinds' own session fixtures are imported from their conftests, so both folders and this one
build each repository once per session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.serving import start_serve
from mlserver.conftest import mlserver, mlserver_bin, mlserver_repository  # noqa: F401 (fixtures)
from support.mlserver import PATIENT
from triton.conftest import served, triton, triton_markers, triton_repository  # noqa: F401 (fixtures)

KINDS = ("triton", "mlserver")


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "mlserver":
        request.getfixturevalue("mlserver_bin")  # skips where MLServer is not installed
    return request.param


@pytest.fixture(scope="module")
def raw(request: pytest.FixtureRequest, kind: str):
    return request.getfixturevalue(kind)


@pytest.fixture(scope="module")
def cap_one(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, kind: str) -> Iterator:
    if kind == "triton":
        yield request.getfixturevalue("served")[0]
        return
    repository = request.getfixturevalue("mlserver_repository")
    program = request.getfixturevalue("mlserver_bin")
    with start_serve(tmp_path_factory.mktemp("race-serve"), repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", program, "--max-models-per-node", "1",
                     *PATIENT) as serve:
        yield serve
