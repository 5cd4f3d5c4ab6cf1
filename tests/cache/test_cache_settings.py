"""The cache's settings are the settings' cache section: defaults, and a bad value fails naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from tfscache import settings as settings_mod
from tfscache.settings import CacheSection, SettingsError


def test_defaults_have_no_caps_and_auto():
    s = CacheSection()
    assert (s.max_models_per_node, s.memory_per_node, s.policy, s.estimate_factor, s.health_retry_s) == (
        0, 0, "auto", 1.2, 5.0)


@pytest.mark.parametrize("field", ["max_models_per_node", "room_timeout_s", "failure_backoff_s",
                                   "rpc_deadline_s", "reload_deadline_s", "health_retry_s", "estimate_factor"])
def test_negative_values_fail_naming_the_field(field):
    with pytest.raises(SettingsError, match=rf"cache\.{field}"):
        settings_mod.load(env={}, overrides={"model_repository": "/m", f"cache.{field}": -1})


@pytest.mark.parametrize("source", ["env", "override"])
def test_every_cache_field_can_be_set(source, tmp_path):
    values = {"max_models_per_node": 3, "memory_per_node": 1 << 30, "policy": "lfu", "load_timeout_s": 7.0,
              "room_timeout_s": 2.0, "failure_backoff_s": 3.0, "rpc_deadline_s": 4.0, "reload_deadline_s": 5.0,
              "estimate_factor": 1.5, "health_retry_s": 0.5, "policy_window_s": 30.0, "gpu_memory_per_node": 1 << 33,
              "policy_halflife_requests": 500.0, "free_wait_s": 2.5, "prefetch": True, "prefetch_window_s": 2.0,
              "prefetch_confidence": 0.6, "prefetch_min_support": 4.0, "prefetch_halflife_requests": 300.0,
              "prefetch_followers": 2, "prefetch_max_models": 1000, "demote": "none",
              "demote_cpu_instances": 2, "promote_horizon_s": 30.0, "promote_queue": 2}
    assert set(values) == {f.name for f in dataclasses.fields(CacheSection)}  # every field
    if source == "env":
        env = {f"TFSCACHE_CACHE_{k.upper()}": str(v) for k, v in values.items()}
        loaded = settings_mod.load(env={**env, "TFSCACHE_MODEL_REPOSITORY": str(tmp_path)})
    else:
        loaded = settings_mod.load(env={}, overrides={"model_repository": str(tmp_path),
                                                      **{f"cache.{k}": v for k, v in values.items()}})
    assert {k: getattr(loaded.cache, k) for k in values} == values


def test_unknown_policy_fails_naming_the_known_ones():
    with pytest.raises(SettingsError, match=r"cache\.policy.*must be one of auto, cost, fifo, gdsf, lfu, lru, oldest"):
        settings_mod.load(env={}, overrides={"model_repository": "/m", "cache.policy": "nope"})


def test_the_oldest_policy_is_selectable_with_its_window():
    loaded = settings_mod.load(env={}, overrides={"model_repository": "/", "cache.policy": "oldest",
                                                  "cache.policy_window_s": "15"})
    assert (loaded.cache.policy, loaded.cache.policy_window_s) == ("oldest", 15.0)
    with pytest.raises(SettingsError, match=r"cache\.policy_window_s: '0' \(must be > 0\)"):
        settings_mod.load(env={}, overrides={"model_repository": "/", "cache.policy_window_s": "0"})


def test_the_gpu_cap_reads_sizes():
    loaded = settings_mod.load(env={"TFSCACHE_CACHE_GPU_MEMORY_PER_NODE": "20GiB"},
                               overrides={"model_repository": "/"})
    assert loaded.cache.gpu_memory_per_node == 20 << 30
    assert CacheSection().gpu_memory_per_node == 0  # off by default


@pytest.mark.parametrize(("field", "value"), [("demote", "disk"), ("demote_cpu_instances", 0)])
def test_a_bad_demotion_setting_fails_naming_the_field_and_the_default_is_none(field, value):
    assert (CacheSection().demote, CacheSection().demote_cpu_instances) == ("none", 1)
    with pytest.raises(SettingsError, match=rf"cache\.{field}"):
        settings_mod.load(env={}, overrides={"model_repository": "/m", f"cache.{field}": value})


def test_demote_host_is_taken_for_triton_and_refused_for_kinds_that_cannot_move_in_place(tmp_path):
    from tfscache import settings as settings_mod

    for kind in ("tfserving", "mlserver"):
        with pytest.raises(settings_mod.SettingsError,
                           match=f"cache.demote: 'host' .node.backend {kind} cannot move"):
            settings_mod.load(None, {}, {"model_repository": str(tmp_path), "node.backend": kind,
                                         "cache.demote": "host"})
    loaded = settings_mod.load(None, {}, {"model_repository": str(tmp_path),
                                          "node.backend": "triton", "cache.demote": "host",
                                          "cache.demote_cpu_instances": 2})
    assert (loaded.cache.demote, loaded.cache.demote_cpu_instances) == ("host", 2)
