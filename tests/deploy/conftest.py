"""Fixtures for the deploy/ manifest tests: every (TF Serving, sidecar) pair of every deployment."""

from __future__ import annotations

import pytest

from . import manifests

PAIRS = [(kind, pair) for kind, pairs in manifests.deployments().items() for pair in pairs]


@pytest.fixture(params=PAIRS, ids=[f"{kind}-{pair.name}" for kind, pair in PAIRS])
def pair(request) -> manifests.Pair:
    return request.param[1]


@pytest.fixture
def sidecar_settings(pair, tmp_path):
    """The settings the pair's sidecar starts with (its TOML and TFSCACHE_* environment)."""
    repository = tmp_path / "models"
    repository.mkdir()
    return manifests.load_sidecar_settings(manifests.sidecar_config_text(pair), pair.sidecar_env, tmp_path,
                                           repository)
