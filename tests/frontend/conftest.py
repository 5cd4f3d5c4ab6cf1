"""Front-end fixtures: one model repository for the session (TF Serving's test models
plus ``addk_0`` .. ``addk_7``, each computing y = x + k)."""

from __future__ import annotations

import pytest

from frontend.serving import link_repository

ADDK = range(8)


@pytest.fixture(scope="session")
def frontend_repo(test_models, synthetic_models, tmp_path_factory):
    bases = [p for p in sorted(test_models.iterdir()) if p.is_dir()] + synthetic_models(ADDK)
    return link_repository(tmp_path_factory.mktemp("frontend") / "models", bases)
