"""tfscache.cluster.topology alone: the one ring builder, drained nodes, join rules, the atomic swap.

No process runs: local nodes are real ``NodeBackend``s with nothing attached, peers are
``FakePeer``s (``PeerBackend``s whose upstream only records ``retire``/``close``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from tfscache import errors
from tfscache.frontend.backends import Backend, NodeBackend, PeerBackend
from tfscache.frontend.router import Router
from tfscache.cluster.ring import Ring
from tfscache.cluster.topology import Topology, ring_nodes


@dataclass(frozen=True)
class Peer:  # what discovery reports (tfscache.discovery.Peer's fields)
    name: str
    grpc: str
    rest: str = ""
    tier: str = "gpu"


class FakeUpstream:
    def __init__(self, grpc_address: str) -> None:
        self.grpc_address = grpc_address
        self.retired = asyncio.Event()
        self.closed = False
        self.hold = asyncio.Event()  # retire waits on it: "calls still in flight"

    async def retire(self, grace: float) -> None:
        self.retired.set()
        await self.hold.wait()
        self.closed = True

    async def close(self) -> None:
        self.closed = True


def make_peer(peer: Peer) -> PeerBackend:
    return PeerBackend(peer.name, FakeUpstream(peer.grpc), "a")


def peers(*names: str, port: int = 1) -> list[Peer]:
    return [Peer(n, f"{n}:{port}") for n in names]


def sidecar(in_ring: bool = True) -> Topology:
    topology = Topology(replicas=2, vnodes=16, own="a", in_ring=in_ring, make_peer=make_peer)
    topology.set_nodes([NodeBackend("a")])
    return topology


# -- the pure rule --------------------------------------------------------------------------


@pytest.mark.parametrize("names, own, in_ring, drained, expected", [
    (["n0", "n1", "n2"], None, True, [], ["n0", "n1", "n2"]),   # embedded
    (["n0", "n1", "n2"], None, True, ["n1"], ["n0", "n2"]),      # embedded, one drained
    (["a", "b", "c"], "a", True, [], ["a", "b", "c"]),           # sidecar, joined
    (["a", "b", "c"], "a", False, [], ["b", "c"]),               # not joined: the cluster's ring without it
    (["a"], "a", False, [], ["a"]),                              # ...unless nobody else is known
    (["a", "b"], "a", True, ["a"], ["b"]),                       # draining sidecar: off its own ring
    (["a"], "a", True, ["a"], ["a"]),                            # ...unless it is alone
    (["a", "b"], "a", True, ["b"], ["a"]),                       # a drained name stays off
])
def test_ring_nodes(names, own, in_ring, drained, expected):
    assert ring_nodes(names, own=own, in_ring=in_ring, drained=drained) == expected


# -- one ring builder ---------------------------------------------------------------------------


def test_the_topology_is_the_only_place_a_ring_is_built():
    import pathlib

    import tfscache

    root = pathlib.Path(tfscache.__file__).parent
    builders = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                      if "Ring(" in p.read_text() and p.name not in ("ring.py",))
    # the simulator replays a trace over its own, offline ring, and plan-resize compares two offline
    # rings (tfscache plan-resize); nothing else builds one
    assert [b for b in builders if not b.startswith(("sim/", "cli/simulate", "cli/plan_resize"))] == [
        "cluster/topology.py"]


def test_backends_satisfy_the_protocol():
    assert isinstance(NodeBackend("n"), Backend)
    assert isinstance(make_peer(Peer("b", "b:1")), Backend)


# -- embedded -----------------------------------------------------------------------------------


def test_embedded_ring_and_drain():
    topology = Topology(replicas=1, vnodes=16)
    topology.set_nodes([NodeBackend("node1"), NodeBackend("node0")])
    assert topology.ring.nodes == ["node0", "node1"]
    assert [n.name for n in topology.nodes()] == ["node0", "node1"]
    topology.drain("node1")
    assert topology.ring.nodes == ["node0"] and topology.drained == {"node1"}
    assert set(topology.backends) == {"node0", "node1"}  # drained, still a backend (its cache drains)
    with pytest.raises(errors.FailedPrecondition, match="node node0 is the last node on the ring"):
        topology.drain("node0")
    assert topology.ring.nodes == ["node0"]
    topology.drain("node1")  # again: nothing to refuse
    topology.restore("node1")
    assert topology.ring.nodes == ["node0", "node1"]


def test_embedded_has_no_peers():
    topology = Topology()
    topology.set_nodes([NodeBackend("node0")])
    with pytest.raises(ValueError, match="only a sidecar"):
        topology.set_peers(peers("b"))


def test_serving_needs_a_healthy_own_node():
    topology = sidecar()
    assert not topology.serving()  # its node is not attached
    topology.node("a").attach(FakeUpstream("a:1"), type("Cache", (), {"healthy": True})())
    assert topology.serving()
    embedded = Topology()
    assert not embedded.serving()  # no ring yet
    embedded.set_nodes([NodeBackend("n0"), NodeBackend("n1")])
    assert not embedded.serving()
    embedded.node("n1").attach(FakeUpstream("n1:1"), type("Cache", (), {"healthy": True})())
    assert embedded.serving()


# -- sidecar: peers, drains, join ---------------------------------------------------------------


async def test_drained_nodes_stay_off_across_set_peers():
    topology = sidecar()
    topology.set_peers(peers("a", "b", "c"))
    assert topology.ring.nodes == ["a", "b", "c"]
    topology.drain("a")  # the process drain: off its own ring
    assert topology.ring.nodes == ["b", "c"]
    topology.set_peers(peers("a", "b", "c", "d"))  # discovery re-reports it
    assert topology.ring.nodes == ["b", "c", "d"]
    topology.set_peers(peers("a"))  # everyone else gone: nowhere else to send requests
    assert topology.ring.nodes == ["a"]
    topology.set_peers(peers("a", "b"))
    assert topology.ring.nodes == ["b"]
    await topology.close()


async def test_not_joined_until_join():
    topology = sidecar(in_ring=False)
    assert topology.ring.nodes == ["a"]  # alone: itself
    topology.set_peers(peers("b", "c"))
    assert topology.ring.nodes == ["b", "c"] and not topology.in_ring
    assert "a" in topology.backends  # still serves forwarded requests and admin preloads
    assert topology.join() is True
    assert topology.ring.nodes == ["a", "b", "c"] and topology.in_ring
    assert topology.join() is False
    topology.set_peers(peers("a", "b"))
    assert topology.ring.nodes == ["a", "b"]
    await topology.close()


def test_embedded_is_always_in_ring():
    assert Topology(in_ring=False).in_ring


async def test_peers_gone_or_moved_are_retired_once_idle():
    topology = sidecar()
    topology.set_peers(peers("b", "c"))
    b, c = topology.backends["b"], topology.backends["c"]
    topology.set_peers(peers("b", "c"))  # same addresses: the same backends
    assert (topology.backends["b"], topology.backends["c"]) == (b, c)
    topology.set_peers([Peer("b", "b:2"), Peer("d", "d:1")])  # b moved, c gone
    assert topology.backends["b"] is not b and "c" not in topology.backends
    await asyncio.wait_for(b.upstream.retired.wait(), 5)
    await asyncio.wait_for(c.upstream.retired.wait(), 5)
    assert not b.upstream.closed  # its calls in flight finish first
    b.upstream.hold.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert b.upstream.closed
    await topology.close()  # c, still retiring, is closed now
    assert c.upstream.closed
    assert not topology.backends["d"].upstream.closed


# -- the atomic swap ----------------------------------------------------------------------------


class RecordingRouter:
    def __init__(self) -> None:
        self.updates: list[tuple[Ring, object]] = []

    def update(self, ring: Ring, backends) -> None:
        self.updates.append((ring, backends))


async def test_the_router_gets_ring_and_backends_together():
    topology = sidecar()
    router = RecordingRouter()
    topology.bind(router)
    assert router.updates == [(topology.ring, topology.backends)]
    assert topology.set_peers(peers("b")) is None  # synchronous: no await between the two
    topology.drain("a")
    topology.set_peers(peers("b", "c"))
    for ring, backends in router.updates:
        assert set(ring.nodes) <= set(backends)  # every ring node has its backend
    assert router.updates[-1] == (topology.ring, topology.backends)
    assert router.updates[-1][0].nodes == ["b", "c"]
    await topology.close()


async def test_a_real_router_follows_and_cannot_mutate():
    topology = sidecar()
    router = Router(topology.ring, topology.backends, local="a")
    topology.bind(router)
    topology.set_peers(peers("b"))
    assert router.ring is topology.ring and router.backends is topology.backends
    assert router.ring.nodes == ["a", "b"]
    with pytest.raises(TypeError):
        router.backends["x"] = NodeBackend("x")  # only the topology changes backends
    await topology.close()


def test_host_tier_nodes_are_backends_off_the_ring():
    topology = Topology(replicas=1, vnodes=16)
    topology.set_nodes([NodeBackend("node0"), NodeBackend("host0"), NodeBackend("host1")],
                       host_tier=["host1", "host0"])
    assert topology.ring.nodes == ["node0"]
    assert sorted(topology.backends) == ["host0", "host1", "node0"]
    assert [b.name for b in topology.host_tier()] == ["host0", "host1"]
    order = [b.name for b in topology.host_tier_for("m")]
    assert sorted(order) == ["host0", "host1"]
    assert [b.name for b in topology.host_tier_for("m")] == order  # the same each time
    assert [n.name for n in topology.nodes()] == ["host0", "host1", "node0"]


async def test_host_tier_peers_and_a_host_tier_sidecar_of_its_own_stay_off_the_ring():
    gpu = Topology(replicas=1, vnodes=16, own="a", make_peer=make_peer)
    gpu.set_nodes([NodeBackend("a")])
    gpu.set_peers([Peer("a", "a:1"), Peer("b", "b:1"), Peer("h", "h:1", tier="host")])
    assert gpu.ring.nodes == ["a", "b"]
    assert [b.name for b in gpu.host_tier()] == ["h"]
    assert [b.name for b in gpu.host_tier_for("m")] == ["h"]
    gpu.set_peers([Peer("b", "b:1"), Peer("h", "h:1")])  # h now announced as gpu: a new backend
    assert gpu.ring.nodes == ["a", "b", "h"] and gpu.host_tier() == []
    host = Topology(replicas=1, vnodes=16, own="h", make_peer=make_peer, own_tier="host")
    host.set_nodes([NodeBackend("h")])
    assert host.ring.nodes == ["h"]  # nobody else yet: it is the only place to go
    host.set_peers([Peer("a", "a:1"), Peer("h", "h:1", tier="host")])
    assert host.ring.nodes == ["a"]
    assert [b.name for b in host.host_tier()] == ["h"]
    await gpu.close()
