"""gdsf: decayed frequency x load seconds / room, remembered across evictions; auto picks it under a memory cap."""

from __future__ import annotations

import random

import pytest

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan
from tfscache.cache.policy import make_policy, resolve
from tfscache.cache.policy.gdsf import GDSFPolicy
from tfscache.cache.policy.lru import LRUPolicy
from tfscache.settings import CacheSection

GB = 10**9


def loaded(policy: GDSFPolicy, key: str, size: int, seconds: float, uses: int = 1) -> None:
    policy.record_load(key, size, seconds, 0.0)
    for _ in range(uses):
        policy.record_access(key, 0.0)


def test_under_a_memory_cap_the_larger_model_goes_first_at_one_cost_and_use():
    policy = GDSFPolicy(memory_bytes=10 * GB)
    loaded(policy, "big", 4 * GB, 2.0)
    loaded(policy, "small", 1 * GB, 2.0)
    assert policy.victims(["small", "big"], 0.0) == ["big", "small"]


def test_the_slower_to_load_stays_and_the_more_used_stays():
    policy = GDSFPolicy(memory_bytes=10 * GB)
    loaded(policy, "slow", GB, 9.0)
    loaded(policy, "fast", GB, 1.0)
    loaded(policy, "hot", GB, 1.0, uses=5)
    assert policy.victims(["slow", "fast", "hot"], 0.0) == ["fast", "hot", "slow"]


def test_worth_per_byte_decides_a_big_slow_model_against_a_small_fast_one():
    policy = GDSFPolicy(memory_bytes=10 * GB)
    loaded(policy, "big", 5 * GB, 10.0)  # 2 s per GB
    loaded(policy, "small", GB, 1.0)  # 1 s per GB
    assert policy.victims(["big", "small"], 0.0) == ["small", "big"]
    assert policy.worth("big") == pytest.approx(10.0 / 0.5, rel=1e-3) and policy.room("small") == pytest.approx(0.1)


def test_under_a_count_cap_alone_size_does_not_matter():
    policy = GDSFPolicy(max_models=4)
    loaded(policy, "big", 4 * GB, 2.0, uses=2)
    loaded(policy, "small", 1 * GB, 2.0)
    assert policy.victims(["small", "big"], 0.0) == ["small", "big"]
    assert policy.room("big") == policy.room("small") == 0.25


def test_frequency_is_remembered_across_an_eviction():
    policy = GDSFPolicy(memory_bytes=10 * GB, halflife=1e9)
    loaded(policy, "popular", GB, 1.0, uses=6)
    policy.forget("popular")
    assert policy.priority("popular") is None and policy.frequency("popular") == pytest.approx(6.0)
    loaded(policy, "newcomer", GB, 1.0, uses=2)
    loaded(policy, "popular", GB, 1.0)  # back, with its 6 earlier requests
    assert policy.frequency("popular") == pytest.approx(7.0)
    assert policy.victims(["popular", "newcomer"], 0.0) == ["newcomer", "popular"]


def test_each_halflife_of_requests_halves_a_count():
    policy = GDSFPolicy(halflife=10)
    loaded(policy, "a", GB, 1.0, uses=4)
    assert policy.frequency("a") == pytest.approx(1 + 2**-0.1 + 2**-0.2 + 2**-0.3)  # each request decayed alone
    start = policy.frequency("a")
    loaded(policy, "b", GB, 1.0, uses=10)
    assert policy.frequency("a") == pytest.approx(start / 2)
    loaded(policy, "b", GB, 1.0, uses=10)
    assert policy.frequency("a") == pytest.approx(start / 4)


def test_a_model_that_stops_being_requested_falls_behind():
    policy = GDSFPolicy(memory_bytes=10 * GB, halflife=5)
    loaded(policy, "yesterday", GB, 1.0, uses=20)
    loaded(policy, "today", GB, 1.0)
    assert policy.victims(["yesterday", "today"], 0.0) == ["today", "yesterday"]
    for _ in range(40):
        policy.record_access("today", 0.0)
    assert policy.victims(["yesterday", "today"], 0.0) == ["yesterday", "today"]


@pytest.mark.parametrize("seed", range(4))
def test_the_heap_order_is_the_order_of_worth_now(seed):
    # H is set at each model's last request; the decay is common to all, so ordering by H
    # must equal ordering by the worth recomputed now.
    rng = random.Random(seed)
    policy = GDSFPolicy(memory_bytes=20 * GB, halflife=7)
    keys = [f"m{i}" for i in range(12)]
    for key in keys:
        policy.record_load(key, rng.randint(1, 5) * GB, rng.uniform(0.5, 5.0), 0.0)
    for _ in range(300):
        key = rng.choice(keys[: rng.randint(1, 12)])
        if rng.random() < 0.05:
            policy.forget(key)
            policy.record_load(key, rng.randint(1, 5) * GB, rng.uniform(0.5, 5.0), 0.0)
        policy.record_access(key, 0.0)
    order = policy.victims(keys, 0.0)
    worths = [policy.worth(key) for key in order]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(worths, worths[1:])), worths
    assert policy.next_victim(0.0) == order[0]


def test_unmeasured_models_are_priced_with_the_mean():
    policy = GDSFPolicy(memory_bytes=10 * GB)
    loaded(policy, "a", 2 * GB, 4.0)
    loaded(policy, "b", 4 * GB, 2.0)
    loaded(policy, "adopted", 0, 0.0, uses=0)  # re-adopted at start-up: nothing measured, never requested
    assert policy.room("adopted") == pytest.approx(0.3) and policy.worth("adopted") == 0.0
    assert policy.victims(["a", "b", "adopted"], 0.0)[0] == "adopted"
    policy.record_access("adopted", 0.0)
    assert policy.worth("adopted") == pytest.approx(3.0 / 0.3)


def test_the_history_is_bounded():
    policy = GDSFPolicy(history=2)
    for key in "abcd":
        loaded(policy, key, GB, 1.0)
        policy.forget(key)
    assert [policy.frequency(key) for key in "abcd"] == [0.0, 0.0, pytest.approx(1.0, rel=1e-3), 1.0]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="halflife must be > 0"):
        GDSFPolicy(halflife=0)
    with pytest.raises(ValueError, match="caps must not be negative"):
        GDSFPolicy(memory_bytes=-1)


def test_auto_is_gdsf_under_a_memory_cap_and_lru_otherwise():
    assert resolve("auto", 8 * GB) == "gdsf" and resolve("auto", 0) == "lru" and resolve("cost", 8 * GB) == "cost"
    policy = make_policy("auto", CacheSection(memory_per_node=8 * GB, policy_halflife_requests=123.0))
    assert isinstance(policy, GDSFPolicy) and policy.halflife == 123.0
    assert isinstance(make_policy("auto", CacheSection(max_models_per_node=5)), LRUPolicy)
    assert isinstance(make_policy("auto"), LRUPolicy)


class _Waiting:
    @staticmethod
    def done() -> bool:
        return False


@pytest.mark.parametrize("held", ["leased", "pinned"])
def test_the_planner_keeps_its_rules_under_gdsf(held):
    # gdsf would take "big" first (least worth per byte); held, it is skipped, and the load
    # takes the next two. With everything held, the load waits for room.
    policy = GDSFPolicy(memory_bytes=100)
    ledger = Ledger()  # no policy: the test tells it itself
    for name, size, seconds in (("big", 50, 1.0), ("mid", 25, 1.0), ("small", 25, 4.0)):
        key = (name, 1)
        ledger.requested(key, _Waiting(), size, size, 0.0)
        ledger.admitted(key, 0.0)
        ledger.loaded(key, seconds, 0.0)
        loaded(policy, key, size, seconds)
    assert policy.victims(list(ledger.entries), 0.0)[0] == ("big", 1)
    if held == "leased":
        ledger.leased(("big", 1), 0.0, 0.0)
    else:
        ledger.pin(("big", 1))
    ledger.requested(("new", 1), _Waiting(), 40, 40, 0.0)
    decided = plan(ledger, Caps(memory_bytes=100), policy, 0.0)
    assert (decided.victims, decided.admit) == ([("mid", 1), ("small", 1)], [("new", 1)])
    for key in (("mid", 1), ("small", 1)):
        ledger.leased(key, 0.0, 0.0)
    decided = plan(ledger, Caps(memory_bytes=100), policy, 0.0)
    assert (decided.victims, decided.admit, decided.blocked) == ([], [], [("new", 1)])
