"""deploy/docker-compose.yml: real Consul, three tensorflow/serving nodes, a sidecar in each one's namespaces."""

from __future__ import annotations

import pytest

from . import checks, manifests

COMPOSE = manifests.load_compose()


def test_compose_topology_agrees_with_the_code():
    assert checks.check_compose(COMPOSE) == []


def first(kind: str) -> str:
    return next(n for n, s in COMPOSE["services"].items() if s.get("image", "").startswith(kind))


def sidecars() -> list[str]:
    return [n for n, s in COMPOSE["services"].items() if "network_mode" in s]


@pytest.mark.parametrize("change, why", [
    (lambda c: manifests.mutated(c, ["services", sidecars()[0], "pid"], delete=True), "pid must be"),
    (lambda c: manifests.mutated(c, ["services", first("tensorflow/serving")], delete=True), "three"),
    (lambda c: manifests.mutated(c, ["services", first("hashicorp/consul")], delete=True), "one real Consul"),
    (lambda c: manifests.mutated(c, ["services", first("hashicorp/consul"), "command"], ["agent", "-server"]),
     "dev agent"),
    (lambda c: manifests.mutated(c, ["services", sidecars()[1], "environment", "TFSCACHE_RING_SELF_NAME"],
                                 c["services"][sidecars()[0]]["environment"]["TFSCACHE_RING_SELF_NAME"]),
     "its own"),
    (lambda c: manifests.mutated(c, ["services", sidecars()[0], "depends_on"], []), "depend on"),
    (lambda c: manifests.mutated(c, ["services", sidecars()[0], "build", "dockerfile"], "Dockerfile"),
     "deploy/Dockerfile"),
    (lambda c: manifests.mutated(c, ["services", first("tensorflow/serving"), "ports"],
                                 [f"{p + 1}:{p + 1}" for p in manifests.sidecar_ports().values()]), "published"),
])
def test_compose_check_can_fail(change, why):
    problems = checks.check_compose(change(COMPOSE))
    assert any(why in p for p in problems), problems


def test_each_sidecar_shares_its_nodes_network_and_pid_namespaces():
    pairs = manifests.compose_pairs(COMPOSE)
    assert len(pairs) == 3
    for pair in pairs:
        node = pair.extra["node_service"]
        assert pair.extra["sidecar"]["network_mode"] == pair.extra["sidecar"]["pid"] == f"service:{node}"
