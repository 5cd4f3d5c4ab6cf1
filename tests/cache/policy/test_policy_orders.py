"""Each policy's eviction order on small hand-made sequences, where the policies differ."""

from __future__ import annotations

import pytest

from tfscache.cache.policy.cost import CostAwarePolicy
from tfscache.cache.policy.fifo import FIFOPolicy
from tfscache.cache.policy.lfu import LFUPolicy
from tfscache.cache.policy.lru import LRUPolicy
from tfscache.sim import build_policy

MB = 1_000_000


def _load(policy, key, now, size=100 * MB, seconds=1.0):
    """As the cache manager does: record the load, then the waiting request's use."""
    policy.record_load(key, size, seconds, now)
    policy.record_access(key, now)


def _drive(policy, sequence, capacity):
    """A cache of ``capacity`` models fed ``sequence``; the keys evicted, in order."""
    resident, evicted = [], []
    for now, key in enumerate(sequence):
        if key in resident:
            policy.record_access(key, float(now))
            continue
        if len(resident) >= capacity:
            victim = list(policy.victims(resident, float(now)))[0]
            policy.forget(victim)
            resident.remove(victim)
            evicted.append(victim)
        _load(policy, key, float(now))
        resident.append(key)
    return evicted


def test_lru_and_fifo_differ_after_a_re_access():
    lru, fifo = LRUPolicy(), FIFOPolicy()
    for policy in (lru, fifo):
        _load(policy, "a", 0.0)
        _load(policy, "b", 1.0)
        policy.record_access("a", 2.0)
    assert list(lru.victims(["a", "b"], 3.0)) == ["b", "a"]
    assert list(fifo.victims(["a", "b"], 3.0)) == ["a", "b"]  # a was loaded first; its use does not count


def test_fifo_keeps_its_place_over_a_new_measurement():
    fifo = FIFOPolicy()
    _load(fifo, "a", 0.0)
    _load(fifo, "b", 1.0)
    fifo.record_load("a", 300 * MB, 0.0, 2.0)  # a measured size for resident a
    assert list(fifo.victims(["b", "a"], 3.0)) == ["a", "b"]
    assert fifo.next_victim(3.0) == "a"


def test_lfu_keeps_a_frequently_used_model():
    lru, lfu = LRUPolicy(), LFUPolicy()
    for policy in (lru, lfu):
        _load(policy, "a", 0.0)
        policy.record_access("a", 1.0)
        policy.record_access("a", 2.0)
        _load(policy, "b", 3.0)  # used once, but more recently
    assert list(lfu.victims(["a", "b"], 4.0)) == ["b", "a"]
    assert list(lru.victims(["a", "b"], 4.0)) == ["a", "b"]


def test_lfu_ties_go_to_the_least_recently_counted():
    lfu = LFUPolicy()
    _load(lfu, "a", 0.0)
    _load(lfu, "b", 1.0)
    _load(lfu, "c", 2.0)
    lfu.record_access("a", 3.0)
    assert list(lfu.victims(["a", "b", "c"], 4.0)) == ["b", "c", "a"]


def test_ageing_lets_an_old_hot_model_go():
    # a is used 5 times, then a stream of new models each used once passes through a
    # cache of two. Each eviction raises the age L; a (K = 0 + 5) is passed by when the
    # newcomers start from L = 4 (K = 5, a tie that the older a loses).
    lfu = LFUPolicy()
    evicted = _drive(lfu, ["a"] * 5 + ["b1", "b2", "b3", "b4", "b5", "b6", "b7"], capacity=2)
    assert evicted[:5] == ["b1", "b2", "b3", "b4", "a"]
    assert lfu.age == 5.0
    # LRU lets a go at the first eviction; plain LFU (no age) would keep it for ever.
    assert _drive(LRUPolicy(), ["a"] * 5 + ["b1", "b2"], capacity=2) == ["a"]


def test_forgetting_a_model_raises_the_age_to_its_priority():
    lfu = LFUPolicy()
    _load(lfu, "a", 0.0)
    lfu.record_access("a", 1.0)
    _load(lfu, "b", 2.0)
    assert (lfu.priority("a"), lfu.priority("b")) == (2.0, 1.0)
    lfu.forget("b")
    assert lfu.age == 1.0
    _load(lfu, "c", 3.0)
    assert lfu.priority("c") == 2.0  # L + 1
    lfu.forget("a")
    lfu.forget("c")
    assert lfu.age == 2.0  # never falls
    assert lfu.priority("a") is None


def test_cost_keeps_the_expensive_model_over_a_cheap_one_of_equal_use():
    lru, cost = LRUPolicy(), build_policy("cost")
    for policy in (lru, cost):
        _load(policy, "slow", 0.0, seconds=10.0)
        _load(policy, "fast", 1.0, seconds=1.0)
    assert list(cost.victims(["slow", "fast"], 2.0)) == ["fast", "slow"]
    assert list(lru.victims(["slow", "fast"], 2.0)) == ["slow", "fast"]


def test_cost_keeps_the_more_used_of_equal_cost():
    cost = CostAwarePolicy()
    _load(cost, "a", 0.0)
    _load(cost, "b", 1.0)
    cost.record_access("a", 2.0)
    assert list(cost.victims(["a", "b"], 3.0)) == ["b", "a"]


@pytest.mark.parametrize(("caps", "first"), [
    ({}, "big"),  # caps unknown: GDSF, seconds per byte
    ({"memory_bytes": 4_000 * MB}, "big"),  # big frees 200x the bytes for 3.3x the reload
    ({"max_models": 10}, "small"),  # every model holds one slot: the cheaper reload goes
    ({"max_models": 10, "memory_bytes": 4_000 * MB}, "big"),  # big holds 1/2 of memory (20 s per cap), small 1/10 of the slots (30)
    ({"max_models": 2, "memory_bytes": 4_000 * MB}, "small"),  # each holds half a cap: the cheaper reload goes
])
def test_cost_weighs_size_by_the_cap_it_takes(caps, first):
    cost = CostAwarePolicy(**caps)
    _load(cost, "big", 0.0, size=2_000 * MB, seconds=10.0)
    _load(cost, "small", 1.0, size=10 * MB, seconds=3.0)
    assert list(cost.victims(["small", "big"], 2.0))[0] == first


def test_cost_reprices_every_model_when_told_the_caps():
    cost = CostAwarePolicy()  # caps unknown: GDSF keeps the small model
    _load(cost, "big", 0.0, size=2_000 * MB, seconds=10.0)
    _load(cost, "small", 1.0, size=10 * MB, seconds=3.0)
    assert list(cost.victims(["small", "big"], 2.0)) == ["big", "small"]
    cost.set_caps(max_models=10, memory_bytes=0)  # now every model holds one slot
    assert list(cost.victims(["small", "big"], 3.0)) == ["small", "big"]
    assert cost.next_victim(3.0) == "small"
    assert cost.priority("big") == pytest.approx(10.0 / 0.1)


def test_cost_prices_an_unknown_load_time_as_the_mean():
    cost = CostAwarePolicy(max_models=10)
    _load(cost, "a", 0.0, seconds=10.0)
    _load(cost, "b", 1.0, seconds=2.0)
    _load(cost, "adopted", 2.0, seconds=0.0)  # re-adopted at start-up: load time unknown
    assert list(cost.victims(["a", "b", "adopted"], 3.0)) == ["b", "adopted", "a"]


def test_cost_reprices_a_new_measurement_at_the_old_age():
    cost = CostAwarePolicy(memory_bytes=1_000 * MB)
    _load(cost, "a", 0.0, size=100 * MB, seconds=5.0)
    _load(cost, "b", 1.0, size=100 * MB, seconds=4.0)
    assert list(cost.victims(["a", "b"], 2.0)) == ["b", "a"]
    cost.record_load("a", 400 * MB, 0.0, 3.0)  # measured: a is 4x larger; its load time stands
    assert cost.priority("a") == pytest.approx(5.0 / 0.4)
    assert list(cost.victims(["a", "b"], 4.0)) == ["a", "b"]


def test_cost_rejects_negative_caps():
    with pytest.raises(ValueError, match="must not be negative"):
        CostAwarePolicy(max_models=-1)
