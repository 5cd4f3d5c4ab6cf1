"""Fixtures shared by the node tests.

* ``half_plus_two_node`` (session): one ``tfscache node --model_name=half_plus_two
  --model_base_path=...`` with no other flags, shared by the modules that need exactly that
  node and leave it as they found it (test_grpc_errors, test_hostile_requests): a node start
  costs TensorFlow's import, seconds of CPU on this machine.
"""

from __future__ import annotations

import pytest

from support.node import start_node


@pytest.fixture(scope="session")
def half_plus_two_node(tmp_path_factory, test_models):
    with start_node(tmp_path_factory.mktemp("half_plus_two_node"), model_name="half_plus_two",
                    model_base_path=str(test_models / "half_plus_two")) as node:
        yield node
