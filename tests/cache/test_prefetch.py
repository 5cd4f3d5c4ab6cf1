"""The co-access learner (tfscache.cache.prefetch) and the prefetch room rule (planner.plan_prefetch), alone."""

from __future__ import annotations

import pytest

from tfscache.cache.ledger import Ledger
from tfscache.cache.planner import Caps, plan_prefetch
from tfscache.cache.policy import make_policy
from tfscache.cache.prefetch import CoAccess, CoAccessSettings, PrefetchCounts


def learner(**kw) -> CoAccess:
    """No decay unless asked (``halflife``): counts are exact."""
    return CoAccess(CoAccessSettings(**{"window_s": 1.0, "min_support": 2.5, "confidence": 0.5, "halflife": 1e9,
                                        **kw}))


def feed(co: CoAccess, pairs: int, a="a", b="b", start=0.0, gap=0.01, spacing=10.0) -> float:
    t = start
    for _ in range(pairs):
        co.observe(a, t)
        co.observe(b, t + gap)
        t += spacing
    return t


def test_learns_a_follower_after_min_support():
    co = learner()
    feed(co, 2)
    assert co.followers("a") == []  # two pairs: below min_support
    feed(co, 1, start=100.0)
    assert co.followers("a") == ["b"]
    assert co.followers("b") == []  # a never follows b within the window (10 s apart)
    assert co.confidence("a", "b") == pytest.approx(1.0, rel=1e-3)


def test_outside_the_window_is_no_pair():
    co = learner()
    feed(co, 10, gap=1.5)
    assert co.followers("a") == []


def test_confidence_threshold():
    co = learner()
    t = feed(co, 4)  # a then b four times
    for i in range(8):  # a alone eight times: 4 / 12 < 0.5
        co.observe("a", t + 10.0 * i)
    assert co.followers("a") == []
    assert co.confidence("a", "b") == pytest.approx(4 / 12, rel=1e-2)


def test_a_model_never_follows_itself_and_each_predecessor_counts_once_per_request():
    co = learner(min_support=0.9, confidence=0.3)
    co.observe("a", 0.0)
    co.observe("a", 0.1)
    co.observe("a", 0.2)
    co.observe("b", 0.3)
    assert co.followers("a") == ["b"]
    assert co.confidence("a", "a") == 0.0
    assert co.confidence("a", "b") == pytest.approx(1 / 3, rel=1e-3)


def test_decay_forgets_a_pipeline_that_stopped_but_not_a_rare_one():
    co = learner(halflife=10)
    t = feed(co, 5)
    assert co.followers("a") == ["b"]
    for i in range(200):  # other traffic ages nothing of a's: a rare predecessor keeps its follower
        co.observe(f"x{i}", t + 10.0 * i)
    assert co.followers("a") == ["b"]
    t += 2000.0
    for i in range(30):  # a alone: the pair's count halves every 10 of a's requests, a's stays near 14
        co.observe("a", t + 10.0 * i)
    assert co.followers("a") == [] and co.confidence("a", "b") < 0.1


def test_followers_ranked_most_likely_first():
    co = learner(min_support=2, confidence=0.3)
    t = 0.0
    for i in range(10):
        co.observe("a", t)
        co.observe("c" if i % 3 else "b", t + 0.01)
        t += 10.0
    assert co.followers("a") == ["c", "b"]


def test_memory_is_bounded():
    co = learner(max_models=100, max_candidates=2, max_window=8)
    for i in range(5_000):
        co.observe(f"m{i % 1000}", i * 0.001)  # up to 8 in the window: many pairs
    assert len(co) == 100
    assert all(len(co.followers(f"m{i}")) <= 2 for i in range(1000))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        CoAccessSettings(confidence=0.0)
    with pytest.raises(ValueError):
        CoAccessSettings(window_s=0.0)


def test_counts():
    counts = PrefetchCounts()
    counts.count("started")
    counts.count("used", 2)
    assert counts.as_dict() == {"started": 1, "completed": 0, "failed": 0, "used": 2, "wasted": 0}
    with pytest.raises(KeyError):
        counts.count("bogus")


# -- the room rule -------------------------------------------------------------------------

def resident(ledger: Ledger, key, size=10, load_s=1.0, now=0.0, accesses=0):
    ledger.requested(key, _Waiter(), size, size, now)
    ledger.admitted(key, now)
    ledger.loaded(key, load_s, now)
    for i in range(accesses):
        ledger.accessed(key, now + i)


class _Waiter:
    @staticmethod
    def done() -> bool:
        return True  # its caller left: only the entry stays


def test_free_room_takes_no_victim():
    policy = make_policy("lru")
    ledger = Ledger(policy)
    resident(ledger, ("a", 1))
    assert ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 2.0, victims=True) == (("b", 1), [])


def test_real_loads_come_first():
    policy = make_policy("lru")
    ledger = Ledger(policy)
    ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    ledger.requested(("c", 1), _LiveWaiter(), 10, 10, 1.0)
    assert plan_prefetch(ledger, Caps(max_models=5), policy, 2.0, victims=True) is None


class _LiveWaiter:
    @staticmethod
    def done() -> bool:
        return False


def test_no_victim_leased_or_pinned():
    policy = make_policy("lru")
    ledger = Ledger(policy)
    resident(ledger, ("a", 1))
    resident(ledger, ("c", 1))
    ledger.leased(("a", 1), 0.0, 1.0)
    ledger.pin(("c", 1))
    ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 2.0, victims=True) is None


def test_lru_takes_the_least_recent_idle_model():
    policy = make_policy("lru")
    ledger = Ledger(policy)
    resident(ledger, ("a", 1), now=0.0)
    resident(ledger, ("c", 1), now=1.0)
    ledger.prefetch(("b", 1), 10, 10, 2.0, None)
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 2.0, victims=True) == (("b", 1), [("a", 1)])


@pytest.mark.parametrize("policy_name", ["fifo", "lfu", "cost", "oldest"])
def test_policies_without_a_rank_for_a_cold_model_take_free_room_only(policy_name):
    policy = make_policy(policy_name)
    ledger = Ledger(policy)
    resident(ledger, ("a", 1))
    ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    assert plan_prefetch(ledger, Caps(max_models=1), policy, 2.0, victims=True) is None
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 2.0, victims=True) == (("b", 1), [])


def test_gdsf_never_evicts_a_model_hotter_than_the_follower():
    policy = make_policy("gdsf")
    policy.set_caps(2, 0)
    ledger = Ledger(policy)
    resident(ledger, ("b", 1), accesses=2)  # b was requested twice, then evicted
    ledger.retire(("b", 1))
    ledger.unloaded(("b", 1))
    resident(ledger, ("hot", 1), accesses=50)
    resident(ledger, ("cold", 1), accesses=0)  # loaded, never requested: colder than b would be
    ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 2.0, victims=True) == (("b", 1), [("cold", 1)])
    ledger.retire(("cold", 1))
    ledger.unloaded(("cold", 1))
    resident(ledger, ("warm", 1), accesses=10)  # hotter than b (2 requests + 1) by GDSF's worth
    assert plan_prefetch(ledger, Caps(max_models=2), policy, 3.0, victims=True) is None


def test_stale_prefetches_are_dropped_and_a_request_makes_one_real():
    ledger = Ledger(make_policy("lru"))
    ledger.prefetch(("b", 1), 10, 10, 1.0, None)
    assert not ledger.prefetch(("b", 1), 10, 10, 1.5, None)  # already queued
    assert ledger.queue() == []
    ledger.drop_abandoned()
    assert [p.key for p in ledger.prefetches()] == [("b", 1)]  # no caller left it: it was never a request
    ledger.requested(("b", 1), _LiveWaiter(), 10, 10, 2.0)
    assert [p.key for p in ledger.queue()] == [("b", 1)] and ledger.prefetches() == []
    ledger.prefetch(("c", 1), 10, 10, 3.0, None)
    ledger.drop_prefetches(before=4.0)
    assert ("c", 1) not in ledger.pending and ("b", 1) in ledger.pending
