"""The consistent-hash ring: distinct replicas, stability, and ~1/N movement."""

from __future__ import annotations

import pytest

from tfscache.cluster.ring import Ring

NAMES = [f"model_{i}" for i in range(5000)]


def test_replicas_are_distinct_and_in_ring_order():
    ring = Ring([f"n{i}" for i in range(5)], replicas=3)
    for name in NAMES[:500]:
        replicas = ring.replicas_for(name)
        assert len(replicas) == 3 and len(set(replicas)) == 3
        assert replicas[0] == ring.owner(name)


def test_replicas_capped_by_ring_size_and_empty_ring():
    assert Ring(["a", "b"], replicas=3).replicas_for("m") in (("a", "b"), ("b", "a"))
    assert Ring([], replicas=2).replicas_for("m") == ()
    assert Ring([]).owner("m") is None
    with pytest.raises(ValueError):
        Ring(["a"], replicas=0)


def test_same_membership_same_placement_regardless_of_insertion_order():
    one = Ring(["a", "b", "c", "d"], replicas=2)
    two = Ring(["d", "c", "b", "a"], replicas=2)
    assert all(one.replicas_for(n) == two.replicas_for(n) for n in NAMES)


def test_spread_is_roughly_even():
    ring = Ring([f"n{i}" for i in range(4)])
    counts = {}
    for name in NAMES:
        counts[ring.owner(name)] = counts.get(ring.owner(name), 0) + 1
    assert min(counts.values()) > len(NAMES) / 4 * 0.7, counts


@pytest.mark.parametrize("n", [4, 8])
def test_adding_one_of_n_nodes_moves_about_one_nth(n):
    ring = Ring([f"n{i}" for i in range(n - 1)])
    before = {name: ring.owner(name) for name in NAMES}
    ring.add(f"n{n - 1}")
    after = {name: ring.owner(name) for name in NAMES}
    moved = [name for name in NAMES if before[name] != after[name]]
    # Every moved name moved to the new node: nothing shuffles between old nodes.
    assert all(after[name] == f"n{n - 1}" for name in moved)
    assert 0.5 / n < len(moved) / len(NAMES) < 1.5 / n


@pytest.mark.parametrize("n", [4, 8])
def test_removing_one_of_n_nodes_moves_only_its_models(n):
    ring = Ring([f"n{i}" for i in range(n)], replicas=2)
    before = {name: ring.replicas_for(name) for name in NAMES}
    ring.remove("n0")
    moved = [name for name in NAMES if before[name][0] != ring.owner(name)]
    assert all(before[name][0] == "n0" for name in moved)
    assert 0.5 / n < len(moved) / len(NAMES) < 1.5 / n
    # The removed node's models go to their old second replica: already warm there.
    assert all(ring.owner(name) == before[name][1] for name in moved)
