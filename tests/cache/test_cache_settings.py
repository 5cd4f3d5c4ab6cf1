"""CacheSettings: defaults, and a bad value fails naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from tfscache.cache import CacheSettings


def test_defaults_have_no_caps_and_lru():
    s = CacheSettings()
    assert (s.max_models, s.memory_bytes, s.policy, s.estimate_factor, s.state_file) == (0, 0, "lru", 1.2, None)


def test_every_field_is_documented():
    import inspect

    source = inspect.getsource(CacheSettings)
    for field in dataclasses.fields(CacheSettings):
        line = next(line for line in source.splitlines() if line.strip().startswith(f"{field.name}:"))
        following = source.splitlines()[source.splitlines().index(line) + 1].strip()
        assert following.startswith('"""') and following.endswith('"""'), field.name


@pytest.mark.parametrize("field", ["max_models", "memory_bytes", "room_timeout_s", "failure_backoff_s",
                                   "rpc_deadline_s", "reload_deadline_s", "health_retry_s"])
def test_negative_values_fail_naming_the_field(field):
    with pytest.raises(ValueError, match=rf"^cache setting {field} must not be negative, got -1$"):
        CacheSettings(**{field: -1})


def test_unknown_policy_fails_at_construction():
    with pytest.raises(ValueError, match=r"^unknown eviction policy 'nope'; known: cost, fifo, lfu, lru$"):
        CacheSettings(policy="nope")
