"""tfscache.observe.server.status_document alone: a node's models by state and its caps (issue 10)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from support.fakecache import FakeCache, resident
from tfscache.cache.ledger import ResidentModel
from tfscache.discovery import Peer
from tfscache.frontend.backends import NodeBackend, PeerBackend
from tfscache.observe.metrics import Metrics
from tfscache.observe.server import status_document
from tfscache.observe.workermetrics import snapshot
from tfscache.cluster.topology import Topology


@dataclass
class FakeUpstream:
    grpc_address: str


def topology(nodes: list[NodeBackend], peers: tuple[str, ...] = ()) -> Topology:
    """Local ``nodes``, and ``peers`` as another sidecar would have them (the first node is this one)."""
    t = Topology(own=nodes[0].name if peers else None,
                 make_peer=lambda p: PeerBackend(p.name, FakeUpstream(p.grpc), nodes[0].name))
    t.set_nodes(nodes)
    if peers:
        t.set_peers([Peer(name, f"10.0.0.2:{8500 + i}") for i, name in enumerate(peers)])
    return t


def model(name: str, state: str, size: int = 100, leases: int = 0) -> ResidentModel:
    return resident(name, size=size, leases=leases, state=state, last_use=1000.0)


def test_a_node_capped_at_three_with_five_in_its_config():
    cache = FakeCache([model("a", "available", 100, leases=2), model("b", "available", 200),
                       model("c", "loading", 400), model("d", "unloading", 800), model("e", "unloading", 1600)],
                      max_models=3, memory_bytes=10_000)
    doc = status_document(Metrics(), topology([NodeBackend("node0", FakeUpstream("127.0.0.1:1"), cache)]))
    (node,) = doc["nodes"]
    assert node["model_states"] == {"loading": {"models": 1, "bytes": 400},
                                    "available": {"models": 2, "bytes": 300},
                                    "unloading": {"models": 2, "bytes": 2400}}
    assert (node["resident_models"], node["resident_bytes"]) == (2, 300)  # available only
    assert node["caps"] == {"max_models": 3, "memory_bytes": 10_000}
    assert node["models"][0] == {"name": "a", "version": 1, "bytes": 100, "measured": True, "leases": 2,
                                 "last_use": 1000.0, "state": "available", "pinned": False,
                                 "tier": "gpu", "moving": ""}
    assert [m["state"] for m in node["models"]] == ["available", "available", "loading", "unloading", "unloading"]
    assert node["leases"] == 2
    states = node["model_states"]
    assert states["loading"]["models"] + states["available"]["models"] <= node["caps"]["max_models"]
    json.dumps(doc)  # served as JSON


def test_every_state_is_present_and_a_down_node_has_no_caps():
    doc = status_document(Metrics(), topology([NodeBackend("node0", FakeUpstream("127.0.0.1:1"), FakeCache([])),
                                               NodeBackend("node1")], peers=("peer",)))
    empty = {state: {"models": 0, "bytes": 0} for state in ("loading", "available", "unloading")}
    node0, node1, peer = doc["nodes"]
    assert [(n["name"], n["kind"], n["healthy"]) for n in doc["nodes"]] == [
        ("node0", "node", True), ("node1", "node", False), ("peer", "peer", True)]
    assert peer["address"] == "10.0.0.2:8500" and doc["ring"] == {"nodes": ["node0", "node1", "peer"], "replicas": 1}
    assert node0["model_states"] == empty and node0["caps"] == {"max_models": 0, "memory_bytes": 0}
    assert node1["model_states"] == empty and node1["caps"] is None and node1["resident_models"] == 0
    assert "model_states" not in peer and "caps" not in peer


def test_workers_come_from_the_control_processs_provider_and_only_then():
    nodes = [NodeBackend("node0", FakeUpstream("127.0.0.1:1"), FakeCache([]))]
    assert "workers" not in status_document(Metrics(), topology(nodes))  # one process: as before
    listed = [{"id": 0, "pid": 4001, "in_flight": 2, "restarts": 0, "delegations": [("a", 1), ("b", None)]},
              {"id": 1, "pid": 4007, "in_flight": 0, "restarts": 1, "delegations": 0, "alive": True}]
    control, worker = Metrics(), Metrics()
    for _ in range(5):
        worker.request("grpc", "Predict", "OK", worker.begin())
    control.exported.update(1, snapshot(worker.registry))
    doc = status_document(control, topology(nodes), workers=lambda: listed)
    assert doc["workers"] == [
        {"id": 0, "pid": 4001, "in_flight": 2, "restarts": 0, "delegations": 2, "requests": 0},  # a list: counted
        {"id": 1, "pid": 4007, "in_flight": 0, "restarts": 1, "delegations": 0, "alive": True, "requests": 5}]
    json.dumps(doc)
