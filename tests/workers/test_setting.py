"""``server.workers`` / ``--workers``: a count, or auto (one per core, at most 8); 1 by default."""

from __future__ import annotations

import os

import pytest

from tfscache import settings as settings_mod


def workers(value=None, env=None) -> int:
    overrides = {"model_repository": "."} if value is None else {"model_repository": ".", "server.workers": value}
    return settings_mod.load(None, env or {}, overrides).server.workers


def test_default_is_one_process():
    assert workers() == 1


@pytest.mark.parametrize("value, expected", [("2", 2), (4, 4), ("16", 16)])
def test_a_count(value, expected):
    assert workers(value) == expected


def test_auto_is_one_per_core_at_most_eight():
    assert workers("auto") == workers("AUTO") == min(os.cpu_count() or 1, 8)


def test_from_the_environment():
    assert workers(env={"TFSCACHE_SERVER_WORKERS": "3"}) == 3


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", True])
def test_a_bad_value_names_the_field(value):
    with pytest.raises(settings_mod.SettingsError) as info:
        workers(value)
    assert "server.workers" in str(info.value)
