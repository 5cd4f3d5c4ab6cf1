"""Test models for MLServer: scikit-learn and XGBoost models trained in seconds, no network.

    build_mlserver_models(dest, python=".mlserver/bin/python", synthetic=12)
    build_mlserver_models(dest, python, synthetic=0, padding_bytes=64 << 20)   # addk_pad too

The models are trained and saved by ``python``, the interpreter of MLServer's own environment
(scripts/install_mlserver.sh), so the pickles match the scikit-learn and XGBoost that MLServer's
runtimes load them with; tfscache's environment needs neither library. Every model is
``DEST/NAME/1/`` (version "1": MLServer names versions by ``parameters.version``, a string, and
tfscache's repository by the directory's number, so the two are the same) holding
``model-settings.json`` (``name``, ``implementation``, ``parameters.uri`` relative to that
folder, ``parameters.version``) and the model file:

* ``addk_K`` (mlserver_sklearn.SKLearnModel, ``model.joblib``): a LinearRegression fitted on
  y = x + K; its coefficients are rounded after the fit so that ``predict`` is exact
  (input a [N, 1] tensor, output ``predict`` = x + K). ``addk_pad``: the same with K = 7 and a
  ``padding_bytes`` array of ones pickled with it, so a loaded copy really holds that memory.
* ``sk_clf`` (SKLearnModel): a LogisticRegression on two features, classes 0 and 1 (class 1
  when x0 + x1 > 0); outputs ``predict`` (and ``predict_proba`` when asked).
* ``xgb_reg`` (mlserver_xgboost.XGBoostModel, ``model.json``): an XGBRegressor of 8 trees on
  y = 2 x0 - x1 (input [N, 2]).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SKLEARN = "mlserver_sklearn.SKLearnModel"
XGBOOST = "mlserver_xgboost.XGBoostModel"

# Run by MLServer's interpreter: argv[1] is a JSON list of {"kind", "path", ...} to build.
_TRAIN = r'''
import json, sys
import joblib
import numpy as np

rng = np.random.default_rng(7)
for spec in json.loads(sys.argv[1]):
    path = spec["path"]
    if spec["kind"] == "addk":
        from sklearn.linear_model import LinearRegression
        x = rng.uniform(-100, 100, size=(64, 1))
        model = LinearRegression().fit(x, x[:, 0] + spec["k"])
        model.coef_ = np.round(model.coef_, 6)           # exactly 1.0 and K: exact answers
        model.intercept_ = float(np.round(model.intercept_, 6))
        if spec.get("padding_bytes"):
            model.padding_ = np.ones(spec["padding_bytes"], dtype=np.uint8)
        joblib.dump(model, path)
    elif spec["kind"] == "clf":
        from sklearn.linear_model import LogisticRegression
        x = rng.normal(size=(200, 2))
        joblib.dump(LogisticRegression().fit(x, (x[:, 0] + x[:, 1] > 0).astype(int)), path)
    elif spec["kind"] == "xgb":
        import xgboost
        x = rng.normal(size=(200, 2))
        model = xgboost.XGBRegressor(n_estimators=8, max_depth=3, n_jobs=1)
        model.fit(x, 2 * x[:, 0] - x[:, 1])
        model.save_model(path)
'''


def model_settings(name: str, implementation: str, uri: str, version: str = "1") -> dict:
    """The ``model-settings.json`` of one version: MLServer's name, runtime, file and version."""
    return {"name": name, "implementation": implementation,
            "parameters": {"uri": f"./{uri}", "version": version}}


def _folder(dest: Path, name: str, implementation: str, uri: str, version: str = "1") -> Path:
    folder = Path(dest) / name / version
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(model_settings(name, implementation, uri, version),
                                                           indent=2) + "\n")
    return folder / uri


def build_mlserver_models(dest: Path, python: str | Path, *, synthetic: int = 12, padding_bytes: int = 0,
                          classifier: bool = True, xgboost: bool = True,
                          padded: dict[str, int] | None = None) -> list[str]:
    """Build ``addk_1`` .. ``addk_N``, ``sk_clf``, ``xgb_reg`` (and ``addk_pad`` holding
    ``padding_bytes`` when not 0; and each ``padded`` {name: k}, predict = x + k, holding
    ``padding_bytes`` too) into ``dest`` with MLServer's ``python``; returns the names."""
    specs: list[dict] = []
    for name, k in (padded or {}).items():
        specs.append({"kind": "addk", "k": k, "padding_bytes": padding_bytes,
                      "path": str(_folder(dest, name, SKLEARN, "model.joblib"))})
    for k in range(1, synthetic + 1):
        specs.append({"kind": "addk", "k": k, "path": str(_folder(dest, f"addk_{k}", SKLEARN, "model.joblib"))})
    if padding_bytes and padded is None:
        specs.append({"kind": "addk", "k": 7, "padding_bytes": padding_bytes,
                      "path": str(_folder(dest, "addk_pad", SKLEARN, "model.joblib"))})
    if classifier:
        specs.append({"kind": "clf", "path": str(_folder(dest, "sk_clf", SKLEARN, "model.joblib"))})
    if xgboost:
        specs.append({"kind": "xgb", "path": str(_folder(dest, "xgb_reg", XGBOOST, "model.json"))})
    subprocess.run([str(python), "-c", _TRAIN, json.dumps(specs)], check=True, timeout=300)
    return [Path(s["path"]).parent.parent.name for s in specs]
