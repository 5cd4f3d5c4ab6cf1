"""Where a peer route goes (tfscache.dataplane.targets.peer_target), decided with no process
running: a sidecar "a" with its own node and a peer sidecar "b", the router over their ring."""

from __future__ import annotations

import pytest

from tfscache.cluster.ring import Ring
from tfscache.cluster.spread import Spread, rule_from
from tfscache.cluster.topology import Topology
from tfscache.dataplane.targets import peer_target
from tfscache.discovery import Peer
from tfscache.settings.sections import CopiesSection, RingSection
from tfscache.frontend.backends import NodeBackend, PeerBackend
from tfscache.frontend.router import Router


class Unused:  # a peer's upstream: never called while deciding
    def __init__(self, grpc_address: str) -> None:
        self.grpc_address = grpc_address


def sidecar(spread: Spread | None, replicas: int = 1) -> Router:
    topology = Topology(replicas=replicas, own="a", make_peer=lambda p: PeerBackend(p.name, Unused(p.grpc), "a"))
    topology.set_nodes([NodeBackend("a")])
    router = Router(topology.ring, topology.backends, local="a", spread=spread)
    topology.bind(router)
    topology.set_peers([Peer("a", "a:1"), Peer("b", "b:1")])
    return router


def owned_by(owner: str) -> list[str]:
    ring = Ring(["a", "b"])
    return [m for m in (f"addk_{k}" for k in range(8)) if ring.owner(m) == owner]


@pytest.mark.parametrize("copies", [False, True])
def test_a_model_the_ring_gives_a_peer_is_routed_to_it_and_one_of_its_own_is_not(copies):
    spread = Spread(rule_from(CopiesSection(), RingSection())) if copies else None
    router = sidecar(spread)
    for name in owned_by("b"):
        assert peer_target(router, spread, name) is router.backends["b"], name
    for name in owned_by("a"):
        assert peer_target(router, spread, name) is None, name


def test_a_model_with_copies_on_both_sidecars_stays_on_the_slow_path():
    spread = Spread(rule_from(CopiesSection(), RingSection(replicas_per_model=2)))
    router = sidecar(spread, replicas=2)
    for name in owned_by("b"):  # two copies, a and b: the slow path balances over them
        assert peer_target(router, spread, name) is None, name


def test_with_no_peer_on_the_ring_nothing_is_routed_to_one():
    router = sidecar(None)
    router.update(Ring(["a"]), {"a": router.backends["a"]})
    assert all(peer_target(router, None, name) is None for name in owned_by("b"))
