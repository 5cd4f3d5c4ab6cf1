"""The oldest policy's order: oldest last inference among cold models, else fewest requests in the window."""

from __future__ import annotations

import pytest

from tfscache.cache.policy import make_policy
from tfscache.cache.policy.lru import LRUPolicy
from tfscache.cache.policy.oldest import OldestPolicy
from tfscache.settings import CacheSection

from .test_policy_orders import _drive, _load


def test_a_hot_model_survives_a_burst_of_one_off_models():
    sequence = ["hot"] * 5 + ["b1", "b2", "b3", "b4"]
    assert _drive(OldestPolicy(window_s=60.0), sequence, capacity=2) == ["b1", "b2", "b3"]
    assert _drive(LRUPolicy(), sequence, capacity=2)[0] == "hot"  # LRU lets it go at the first eviction


def test_a_model_idle_for_a_window_goes_first_however_hot_it_was():
    oldest = OldestPolicy(window_s=60.0)
    _load(oldest, "hot", 0.0)
    for t in range(1, 10):
        oldest.record_access("hot", float(t))
    _load(oldest, "new", 50.0)
    assert list(oldest.victims(["hot", "new"], 60.0)) == ["new", "hot"]  # both warm: 1 request against 10
    assert list(oldest.victims(["hot", "new"], 75.0)) == ["hot", "new"]  # hot is cold now: idle since t=9
    assert oldest.next_victim(75.0) == "hot"


def test_cold_models_go_oldest_last_inference_first_whatever_they_counted():
    oldest = OldestPolicy(window_s=10.0)
    _load(oldest, "a", 0.0)
    _load(oldest, "b", 1.0)
    for _ in range(20):
        oldest.record_access("b", 1.0)
    _load(oldest, "c", 2.0)
    oldest.record_access("a", 3.0)  # a's last inference is the newest
    assert [oldest.requests(k, 100.0) for k in "abc"] == [0, 0, 0]
    assert list(oldest.victims("abc", 100.0)) == ["b", "c", "a"]
    assert oldest.next_victim(100.0) == "b"


def test_warm_models_go_fewest_requests_first_then_oldest_last_inference():
    oldest = OldestPolicy(window_s=60.0)
    for t, key in enumerate("abcd"):
        _load(oldest, key, float(t))
    oldest.record_access("a", 10.0)  # a: 2 requests
    oldest.record_access("c", 11.0)  # c: 2 requests, used after a
    assert list(oldest.victims("abcd", 20.0)) == ["b", "d", "a", "c"]
    assert oldest.next_victim(20.0) == "b"


def test_a_model_loaded_and_never_used_is_cold_and_goes_first():
    oldest = OldestPolicy(window_s=60.0)
    _load(oldest, "used", 0.0)
    oldest.record_load("adopted", 100, 0.0, 1.0)  # re-adopted at start-up: no request yet
    oldest.record_load("preloaded", 100, 0.0, 2.0)
    assert list(oldest.victims(["used", "preloaded", "adopted"], 3.0)) == ["adopted", "preloaded", "used"]


def test_a_new_measurement_keeps_the_place_and_the_count():
    oldest = OldestPolicy(window_s=60.0)
    _load(oldest, "a", 0.0)
    oldest.record_access("a", 1.0)
    _load(oldest, "b", 2.0)
    oldest.record_load("a", 999, 3.0, 4.0)
    assert oldest.requests("a", 5.0) == 2
    assert list(oldest.victims("ab", 5.0)) == ["b", "a"]


def test_a_request_counts_for_between_the_window_less_one_bucket_and_the_window():
    oldest = OldestPolicy(window_s=60.0)  # buckets of 1 s
    _load(oldest, "a", 10.5)
    assert oldest.requests("a", 69.99) == 1
    assert oldest.requests("a", 70.0) == 0  # 59.5 s later: its bucket [10, 11) left the window
    many = OldestPolicy(window_s=60.0)
    many.record_load("a", 1, 0.0, 0.0)
    for t in range(1000):  # one bucket kept per second, at most 60: memory stays bounded
        many.record_access("a", t * 0.5)
    assert many.requests("a", 499.5) == 120
    assert len(many._buckets["a"]) <= OldestPolicy.BUCKETS


def test_the_window_comes_from_the_settings():
    assert make_policy("oldest").window_s == 60.0
    assert make_policy("oldest", CacheSection(policy_window_s=5.0)).window_s == 5.0
    assert make_policy("lru", CacheSection(policy_window_s=5.0)).name == "lru"  # others take their defaults
    with pytest.raises(ValueError, match="window_s must be > 0"):
        OldestPolicy(window_s=0)
