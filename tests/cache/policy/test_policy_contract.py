"""What every eviction policy promises, checked for each one (the simulator's list: lru and ours)."""

from __future__ import annotations

import random

import pytest

from tfscache.cache.policy import EvictionPolicy
from tfscache.sim import build_policy, policy_names
from tfscache.sim.engine import replay

ALL = policy_names()
# next_victim() is an optional fast path (the simulator falls back to victims()): the
# equivalence tests run over the policies that offer it.
FAST = [name for name in ALL if hasattr(build_policy(name), "next_victim")]


def test_the_simulator_knows_every_policy():
    assert {"lru", "fifo", "lfu", "cost"} <= set(ALL)
    assert {"fifo", "lfu", "cost"} <= set(FAST)


@pytest.mark.parametrize("name", ALL)
def test_victims_are_exactly_the_candidates_unknown_first(name):
    policy = build_policy(name)
    assert isinstance(policy, EvictionPolicy)
    assert policy.name == name
    for i, key in enumerate("abcd"):
        policy.record_load(key, 1000 * (i + 1), 0.5 + i, now=float(i))
        policy.record_access(key, now=float(i))
    policy.record_access("b", now=10.0)
    order = list(policy.victims(["c", "a", "zz", "b", "a"], now=11.0))
    assert sorted(order) == ["a", "b", "c", "zz"]  # each candidate once, duplicates dropped
    assert order[0] == "zz"  # never recorded: nothing to keep it for
    assert list(policy.victims([], now=11.0)) == []


@pytest.mark.parametrize("name", ALL)
def test_a_forgotten_key_is_unknown_and_can_come_back(name):
    policy = build_policy(name)
    for i, key in enumerate("abc"):
        policy.record_load(key, 100, 1.0, now=float(i))
        policy.record_access(key, now=float(i))
    for _ in range(5):
        policy.record_access("a", now=5.0)
    policy.forget("a")
    policy.forget("never-seen")  # no error
    assert list(policy.victims(["a", "b"], now=6.0))[0] == "a"  # unknown now: first to go
    policy.record_load("a", 100, 1.0, now=7.0)
    policy.record_access("a", now=7.0)
    # Tracked again, as the newest model (for LFU and cost: priced from the age its eviction set).
    assert list(policy.victims(["a", "b", "c"], now=8.0))[-1] == "a"


@pytest.mark.parametrize("name", ALL)
def test_a_new_measurement_of_the_same_values_changes_nothing(name):
    policy = build_policy(name)
    for i, key in enumerate("abcd"):
        policy.record_load(key, 100 * (i + 1), 1.0 + i, now=float(i))
        policy.record_access(key, now=float(i))
    policy.record_access("a", now=5.0)
    before = list(policy.victims("abcd", now=6.0))
    for i, key in enumerate("abcd"):
        policy.record_load(key, 100 * (i + 1), 1.0 + i, now=7.0)
    assert list(policy.victims("abcd", now=8.0)) == before


def _workload(policy: EvictionPolicy, rng: random.Random, steps: int, tracked: set) -> None:
    """Random loads, uses and forgets; ``tracked`` follows the keys the policy holds."""
    for step in range(steps):
        key = rng.randrange(12)
        roll = rng.random()
        if key not in tracked:
            policy.record_load(key, rng.randint(1, 10**9), rng.uniform(0.0, 20.0), now=float(step))
            tracked.add(key)
        elif roll < 0.15:
            policy.forget(key)
            tracked.discard(key)
        elif roll < 0.25:
            policy.record_load(key, rng.randint(1, 10**9), rng.uniform(0.0, 20.0), now=float(step))
        else:
            policy.record_access(key, now=float(step))


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("seed", range(5))
def test_next_victim_is_the_first_of_victims(name, seed):
    rng = random.Random(seed)
    policy = build_policy(name)
    tracked: set = set()
    for _ in range(20):
        _workload(policy, rng, 40, tracked)
        expected = list(policy.victims(sorted(tracked), now=1e6))[0] if tracked else None
        assert policy.next_victim(now=1e6) == expected


class _VictimsOnly:
    """A policy seen through the four methods of EvictionPolicy alone (no next_victim)."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.name = policy.name
        self.record_load, self.record_access = policy.record_load, policy.record_access
        self.forget, self.victims = policy.forget, policy.victims


@pytest.mark.parametrize("name", FAST)
def test_the_simulator_counts_the_same_through_victims_alone(name):
    rng = random.Random(7)
    requests, nxt = [], 0
    for i in range(2000):
        key = min(int(rng.paretovariate(1.0)), 60)
        requests.append((key, float(i), 10_000 * (1 + key % 7), 0.1 * (1 + key % 5), nxt))
    for cap, memory in ((5, 0), (0, 120_000), (8, 150_000)):
        fast = replay(requests, build_policy(name, cap, memory), cap, memory)
        slow = replay(requests, _VictimsOnly(build_policy(name, cap, memory)), cap, memory)
        assert fast == slow
        assert fast.evictions > 100  # the caps bound: this compared real eviction orders


@pytest.mark.parametrize("name", [n for n in ("lfu", "cost", "gdsf") if n in ALL])
def test_the_heap_of_stale_entries_stays_bounded(name):
    policy = build_policy(name)
    for key in "abc":
        policy.record_load(key, 100, 1.0, now=0.0)
    for i in range(10_000):
        policy.record_access("abc"[i % 3], now=float(i))
    assert len(policy._heap) <= 2 * 3 + 64 + 1
    assert policy.next_victim(now=1e5) == "b"  # b and c have one use fewer than a; b's was counted first
