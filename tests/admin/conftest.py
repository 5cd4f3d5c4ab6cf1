"""Admin-API fixtures: a model repository of small ``addk_1`` .. ``addk_6`` (y = x + k)."""

from __future__ import annotations

import pytest

from support.serving import link_repository

ADDK = range(1, 7)


@pytest.fixture(scope="session")
def admin_repo(synthetic_models, tmp_path_factory):
    return link_repository(tmp_path_factory.mktemp("admin") / "models", synthetic_models(ADDK))
