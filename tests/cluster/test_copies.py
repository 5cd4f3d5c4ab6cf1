"""The pure rule of copies that follow load (tfscache/cluster/copies.py): no process, a fake clock."""

from __future__ import annotations

import math

import pytest

from tfscache.cluster.copies import Copies, CopyRule
from tfscache.cluster.ring import Ring

NODES = [f"node{i}" for i in range(4)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def busy(copies: Copies, model: str, node: str, n: int) -> None:
    for _ in range(n):
        copies.begin(model, node)


@pytest.fixture
def clock():
    return Clock()


def test_ring_order_is_every_node_once_and_starts_with_the_replicas():
    ring = Ring(NODES, replicas=2)
    for i in range(200):
        order = ring.order(f"m{i}")
        assert sorted(order) == NODES
        assert order[:2] == ring.replicas_for(f"m{i}")
        assert ring.order(f"m{i}", 3) == order[:3]
    assert Ring([]).order("m") == ()


def test_an_idle_cluster_sends_every_request_to_the_first_copy(clock):
    copies = Copies(CopyRule(), clock)
    for _ in range(10):
        choice = copies.pick("m", NODES)
        assert (choice.node, choice.spilled, choice.added) == ("node0", False, False)
    assert copies.copies("m", NODES) == ["node0"]


def test_choose_answers_what_pick_would_and_records_nothing(clock):
    """The data plane asks ``choose`` of a model HAProxy routes: the same answer as ``pick``, with
    no copy added and no spill counted, so asking every poll changes nothing."""
    copies = Copies(CopyRule(signal="inflight", min_load=2, hot_inflight=2, balance=0.25), clock)
    busy(copies, "hot", "node0", 2)
    for _ in range(3):
        choice = copies.choose("hot", NODES)
        assert (choice.node, choice.spilled, choice.added) == ("node1", True, True)
    assert copies.copies("hot", NODES) == ["node0"] and (copies.added, copies.spills) == (0, 0)
    assert copies.last_used("hot", "node1") is None
    assert copies.pick("hot", NODES) == choice  # the same, now recorded
    assert copies.copies("hot", NODES) == ["node0", "node1"] and (copies.added, copies.spills) == (1, 1)
    busy(copies, "hot", "node1", 1)
    assert copies.choose("hot", NODES) == copies.pick("hot", NODES)  # under its bound: node1
    assert copies.spills == 2


def test_a_hot_model_over_its_bound_gains_the_next_ring_node(clock):
    copies = Copies(CopyRule(signal="inflight", min_load=2, hot_inflight=2, balance=0.25), clock)
    busy(copies, "hot", "node0", 2)  # bound: max(2, ceil(1.25 * 3 / 4)) = 2; node0 is at it
    choice = copies.pick("hot", NODES)
    assert (choice.node, choice.spilled, choice.added) == ("node1", True, True)
    assert copies.copies("hot", NODES) == ["node0", "node1"]
    assert (copies.added, copies.spills) == (1, 1)
    copies.begin("hot", "node1")
    assert copies.pick("hot", NODES).node == "node1"  # node1 is under its bound: no new copy
    assert copies.copies("hot", NODES) == ["node0", "node1"]


def test_a_model_that_is_not_hot_stays_on_its_copies(clock):
    copies = Copies(CopyRule(signal="inflight", min_load=2, hot_inflight=2), clock)
    busy(copies, "other", "node0", 5)  # node0 is busy with another model's requests
    choice = copies.pick("cold", NODES)
    assert (choice.node, choice.added) == ("node0", False)  # the least loaded of its one copy
    assert copies.copies("cold", NODES) == ["node0"]


def test_copies_stop_at_max_copies_and_then_go_to_the_least_loaded(clock):
    copies = Copies(CopyRule(signal="inflight", max_copies=2, min_load=1, hot_inflight=1), clock)
    busy(copies, "hot", "node0", 3)
    assert copies.pick("hot", NODES).added
    busy(copies, "hot", "node1", 2)
    choice = copies.pick("hot", NODES)
    assert (choice.node, choice.added) == ("node1", False)
    assert copies.copies("hot", NODES) == ["node0", "node1"]


def test_extra_copies_cool_down_last_first_and_never_with_requests_in_flight(clock):
    copies = Copies(CopyRule(signal="inflight", min_load=1, hot_inflight=1, cool_s=60), clock)
    busy(copies, "hot", "node0", 2)
    assert copies.pick("hot", NODES).node == "node1"
    busy(copies, "hot", "node1", 3)
    assert copies.pick("hot", NODES).node == "node2"
    copies.begin("hot", "node2")
    clock.now = 59.0
    assert copies.expire() == []
    for _ in range(3):
        copies.end("hot", "node1")
    clock.now = 200.0
    assert copies.expire() == []  # node2 (the last copy) still has a request in flight
    copies.end("hot", "node2")  # ends at 200: node2's quiet time starts now
    assert copies.expire() == []
    clock.now = 260.0
    assert copies.expire() == [("hot", "node2"), ("hot", "node1")]  # node1 was quiet since 59
    assert copies.copies("hot", NODES) == ["node0"]
    assert copies.removed == 2 and copies.extras() == {}


def test_two_front_ends_with_the_same_ring_spread_onto_the_same_nodes(clock):
    ring = Ring(NODES)
    rule = CopyRule(signal="inflight", min_load=1, hot_inflight=1)
    for name in (f"m{i}" for i in range(50)):
        order = ring.order(name)
        a, b = Copies(rule, clock), Copies(rule, clock)
        for front in (a, b):
            for _ in range(3):
                choice = front.pick(name, order)
                front.begin(name, choice.node)
        assert a.copies(name, order) == b.copies(name, order) == list(order[:3])


def test_a_peer_report_counts_as_load_for_a_while(clock):
    copies = Copies(CopyRule(signal="inflight", min_load=1, hot_inflight=0), clock)
    copies.report("node0", 10)
    assert copies.load("node0") == 10
    assert copies.pick("m", NODES).node == "node1"
    clock.now = 10.0
    assert copies.load("node0") == 0


def test_a_peer_report_of_its_rate_decays_as_its_rate_would(clock):
    copies = Copies(CopyRule(min_load=1, rate_window_s=10), clock)
    assert copies.reported("node0") is None
    copies.report("node0", 20.0)
    assert copies.load("node0") == copies.reported("node0") == 20.0
    assert copies.pick("m", NODES).node == "node1"  # node0 is over its bound on the report alone
    clock.now += 10.0
    assert copies.load("node0") == pytest.approx(20.0 * math.exp(-1))
    for _ in range(10):  # what this front end sent counts when it is more
        copies.begin("m", "node0")
    assert copies.load("node0") == pytest.approx(10.0)
    copies.report("node0", -3)
    assert copies.reported("node0") == 0.0


def test_the_rate_signal_spreads_a_model_that_draws_more_than_its_share(clock):
    copies = Copies(CopyRule(min_load=1, balance=0.1, hot_share=0.5, rate_window_s=10), clock)
    nodes = NODES[:2]
    for _ in range(3):  # a cold model on node1
        copies.begin("cold", "node1")
        copies.end("cold", "node1")
    placed = []
    for _ in range(20):
        node = copies.pick("hot", nodes).node
        copies.begin("hot", node)
        copies.end("hot", node)
        placed.append(node)
    assert copies.copies("hot", nodes) == ["node0", "node1"]
    # node0 takes requests while under 1.1 x the mean rate (this request counted): one over at most
    total = copies.rate("node0") + copies.rate("node1")
    assert copies.rate("node0") <= 1.1 * total / 2 + 1
    assert placed[:2] == ["node0", "node0"] and placed.count("node1") == 7
    # The rate decays: ten windows later, node0 is under its bound again for any model.
    clock.now += 100
    assert copies.rate("node0") < 0.01
    assert copies.pick("hot", nodes).node == "node0"


def test_a_model_under_its_hot_share_does_not_spread_on_rate(clock):
    copies = Copies(CopyRule(min_load=1, balance=0.1, hot_share=0.5), clock)
    for i in range(30):  # node0 busy with many small models, none of them hot
        copies.begin(f"m{i}", "node0")
    copies.begin("m0", "node0")
    choice = copies.pick("m0", NODES)  # m0: 2 of node0's 31, far under half a mean node's 7.75
    assert (choice.node, choice.added) == ("node0", False)


def test_copies_off_is_the_first_healthy_copy(clock):
    copies = Copies(CopyRule(enabled=False, min_copies=2), clock)
    busy(copies, "m", "node0", 100)
    assert copies.pick("m", NODES).node == "node0"
    assert copies.pick("m", NODES, usable=lambda n: n != "node0").node == "node1"


def test_rank_puts_resident_copies_first(clock):
    copies = Copies(CopyRule(min_copies=2), clock)
    assert copies.pick("m", NODES, rank=lambda n: n != "node1").node == "node1"


def test_the_documented_settings_are_the_defaults_and_the_rules():
    import dataclasses
    import re
    import tomllib
    from pathlib import Path

    from tfscache.cluster.spread import rule_from
    from tfscache.settings import CopiesSection, RingSection

    doc = (Path(__file__).resolve().parents[2] / "docs" / "copies.md").read_text()
    [block] = re.findall(r"```toml\n(.*?)```", doc, re.S)
    documented = tomllib.loads(block)["copies"]
    assert documented == {f.name: getattr(CopiesSection(), f.name) for f in dataclasses.fields(CopiesSection)}
    rule = rule_from(CopiesSection(), RingSection())
    assert rule == dataclasses.replace(CopyRule(), min_copies=RingSection().replicas_per_model)
