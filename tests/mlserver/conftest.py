"""Fixtures for tests against a real MLServer (tests/support/mlserver.py).

* ``mlserver_repository`` (session): an MLServer model repository built once by
  support.models.mlserver with MLServer's own interpreter: ``addk_1`` ..
  ``addk_6`` (scikit-learn LinearRegression, predict = x + k), ``sk_clf`` (a scikit-learn
  classifier), ``xgb_reg`` (an XGBoost regressor), and ``broken`` (a model.joblib that does not
  unpickle: every load of it fails).
* ``mlserver`` (session): a running ``mlserver start`` over it, nothing loaded at start.
* ``mlserver_bin``: the ``mlserver`` program, for ``tfscache serve --node-command``.

Every test here skips, naming scripts/install_mlserver.sh, when MLServer is not installed;
scripts/test.sh installs it, so CI runs them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.mlserver import MLSERVER, PYTHON, SKIP_REASON, MLServerProcess, start_mlserver

from support.models.mlserver import SKLEARN, build_mlserver_models, model_settings

ADDK_COUNT = 6


@pytest.fixture(scope="session")
def mlserver_bin() -> str:
    if MLSERVER is None:
        pytest.skip(SKIP_REASON)
    return str(MLSERVER)


@pytest.fixture(scope="session")
def mlserver_repository(tmp_path_factory: pytest.TempPathFactory, mlserver_bin) -> Path:
    root = tmp_path_factory.mktemp("mlserver_repository")
    build_mlserver_models(root, PYTHON, synthetic=ADDK_COUNT)
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model-settings.json").write_text(json.dumps(model_settings("broken", SKLEARN, "model.joblib")))
    (broken / "model.joblib").write_bytes(b"this is not a pickle")
    return root


@pytest.fixture(scope="session")
def mlserver(tmp_path_factory: pytest.TempPathFactory, mlserver_repository: Path) -> Iterator[MLServerProcess]:
    with start_mlserver(tmp_path_factory.mktemp("mlserver"), mlserver_repository) as server:
        yield server
