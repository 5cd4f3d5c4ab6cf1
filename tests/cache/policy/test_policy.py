"""Eviction policies, driven without asyncio or a node (as the simulator will drive them)."""

from __future__ import annotations

import pytest

from tfscache.cache.policy import POLICIES, EvictionPolicy, make_policy
from tfscache.cache.policy.lru import LRUPolicy


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_honours_the_contract(name):
    policy = make_policy(name)
    assert isinstance(policy, EvictionPolicy)
    assert policy.name == name
    for i, key in enumerate("abcd"):
        policy.record_load(key, 1000 * (i + 1), 0.5, now=float(i))
    policy.record_access("b", now=10.0)
    order = list(policy.victims(["a", "b", "c"], now=11.0))
    assert sorted(order) == ["a", "b", "c"]  # exactly the candidates, each once
    policy.forget("a")
    assert sorted(policy.victims(["b", "c"], now=12.0)) == ["b", "c"]
    assert list(policy.victims([], now=12.0)) == []


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown eviction policy 'mru'; known: cost, fifo, gdsf, lfu, lru, oldest$"):
        make_policy("mru")


def test_lru_evicts_least_recently_used_first():
    lru = LRUPolicy()
    lru.record_load("a", 1, 0.1, now=1.0)
    lru.record_load("b", 1, 0.1, now=2.0)
    lru.record_load("c", 1, 0.1, now=3.0)
    assert list(lru.victims(["a", "b", "c"], now=4.0)) == ["a", "b", "c"]
    lru.record_access("a", now=5.0)
    assert list(lru.victims(["a", "b", "c"], now=6.0)) == ["b", "c", "a"]
    lru.record_access("b", now=7.0)
    assert list(lru.victims(["a", "c"], now=8.0)) == ["c", "a"]


def test_lru_reload_of_a_resident_key_keeps_its_recency():
    lru = LRUPolicy()
    lru.record_load("a", 1, 0.1, now=1.0)
    lru.record_load("b", 1, 0.1, now=2.0)
    lru.record_load("a", 5, 0.1, now=3.0)  # a better size measurement, not a use
    assert list(lru.victims(["a", "b"], now=4.0)) == ["a", "b"]


def test_lru_forgotten_key_starts_fresh():
    lru = LRUPolicy()
    lru.record_load("a", 1, 0.1, now=1.0)
    lru.record_load("b", 1, 0.1, now=2.0)
    lru.forget("a")
    lru.record_load("a", 1, 0.1, now=3.0)
    assert list(lru.victims(["a", "b"], now=4.0)) == ["b", "a"]
