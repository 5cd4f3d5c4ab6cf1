"""Fixtures for tests against a real MLServer (tests/support/mlserver.py).

* ``mlserver_repository`` (session): an MLServer model repository built once by
  support.models.mlserver with MLServer's own interpreter: ``addk_1`` ..
  ``addk_6`` (scikit-learn LinearRegression, predict = x + k), ``sk_clf`` (a scikit-learn
  classifier), ``xgb_reg`` (an XGBoost regressor), and ``broken`` (a model.joblib that does not
  unpickle: every load of it fails).
* ``mlserver`` (session): a running ``mlserver start`` over it, nothing loaded at start.
* ``mlserver_bin``: the ``mlserver`` program, for ``tfscache serve --node-command``.
* ``mlserver_flat_repository`` (session): MLServer's own (flat) layout, ``NAME/model-settings.json``
  beside ``model.joblib`` with no version folder: ``addk_1`` .. ``addk_4`` (their
  ``parameters.version`` in ``FLAT``), copied from ``mlserver_repository``, and ``addk_5``
  versioned (``addk_5/1/``).

Every test here skips, naming scripts/install_mlserver.sh, when MLServer is not installed;
scripts/test.sh installs it, so CI runs them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.mlserver import MLSERVER, PYTHON, SKIP_REASON, MLServerProcess, start_mlserver

from support.models.mlserver import SKLEARN, build_mlserver_models, model_settings

ADDK_COUNT = 6
# flat model of mlserver_flat_repository -> its parameters.version (None: no version)
FLAT = {"addk_1": "v1", "addk_2": "v1", "addk_3": None, "addk_4": "2026-a"}


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


@pytest.fixture(scope="session")
def mlserver_flat_repository(tmp_path_factory: pytest.TempPathFactory,
                             mlserver_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("mlserver_flat")
    for name, version in FLAT.items():
        (root / name).mkdir()
        shutil.copy(mlserver_repository / name / "1" / "model.joblib", root / name / "model.joblib")
        parameters = {"uri": "./model.joblib"} | ({"version": version} if version else {})
        (root / name / "model-settings.json").write_text(
            json.dumps({"implementation": SKLEARN, "parameters": parameters}))
    shutil.copytree(mlserver_repository / "addk_5", root / "addk_5")  # versioned: addk_5/1/
    return root
