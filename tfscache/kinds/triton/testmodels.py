"""Test models for NVIDIA Triton: a model repository of Python-backend models (no TF).

    build_triton_models(dest, synthetic=12, padding_bytes=0)   # addk_1..addk_12
    build_addk(dest, k, padding_bytes=50_000_000, name="addk_pad")
    build_sleep(dest, sleep_ms=300)

Every model is ``DEST/NAME/config.pbtxt`` plus ``DEST/NAME/1/model.py`` (version 1), with
``backend: "python"``, ``max_batch_size: 0`` and ``instance_group [{count: 1, kind:
KIND_CPU}]``, so each loaded model is one stub process (triton-behavior.md §7). The config is
complete: Triton runs with ``--disable-auto-complete-config``.

* ``addk_K``: input ``x`` (TYPE_FP32, dims [-1]) -> output ``y`` = x + K (TYPE_FP32, dims
  [-1]). Parameter ``padding_bytes``: ``initialize()`` allocates and touches a uint8 array of
  that many bytes and keeps it while loaded, so the model's process really holds that memory
  and memory caps mean something.
* ``sleep_ms``: input ``x``/output ``y`` as addk (y = x); ``execute()`` sleeps the
  parameter ``sleep_ms`` milliseconds per request.
"""

from __future__ import annotations

from pathlib import Path

_ADDK_PY = '''\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.k = np.float32(float(parameters["k"]["string_value"]))
        padding = int(parameters.get("padding_bytes", {}).get("string_value", "0"))
        self.padding = np.ones(padding, dtype=np.uint8)  # ones: every page touched, resident

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x + self.k).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
'''

_SLEEP_PY = '''\
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = int(parameters["sleep_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(self.sleep_s)
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", x.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
'''


def model_config(name: str, parameters: dict[str, str]) -> str:
    """config.pbtxt of a one-instance CPU python model with input x, output y (FP32 [-1])."""
    params = "".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
                     for key, value in parameters.items())
    return (f'name: "{name}"\n'
            'backend: "python"\n'
            'max_batch_size: 0\n'
            'input [{ name: "x" data_type: TYPE_FP32 dims: [-1] }]\n'
            'output [{ name: "y" data_type: TYPE_FP32 dims: [-1] }]\n'
            'instance_group [{ count: 1 kind: KIND_CPU }]\n'
            f'{params}')


def write_model(dest: Path, name: str, source: str, parameters: dict[str, str]) -> Path:
    """Write DEST/NAME/config.pbtxt and DEST/NAME/1/model.py; returns DEST/NAME."""
    model = Path(dest) / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text(source)
    (model / "config.pbtxt").write_text(model_config(name, parameters))
    return model


def build_addk(dest: Path, k: int, padding_bytes: int = 0, name: str | None = None) -> Path:
    """``addk_K`` (or ``name``): y = x + k, holding ``padding_bytes`` while loaded."""
    return write_model(dest, name or f"addk_{k}", _ADDK_PY,
                       {"k": str(k), "padding_bytes": str(int(padding_bytes))})


def build_sleep(dest: Path, sleep_ms: int, name: str = "sleep_ms") -> Path:
    """``sleep_ms`` (or ``name``): y = x after sleeping ``sleep_ms`` ms per request."""
    return write_model(dest, name, _SLEEP_PY, {"sleep_ms": str(int(sleep_ms))})


def build_triton_models(dest: Path, synthetic: int = 0, padding_bytes: int = 0,
                        sleep_ms: int | None = None) -> dict[str, Path]:
    """addk_1 .. addk_N (each padded by ``padding_bytes``) and, if ``sleep_ms`` is given,
    the sleep model; returns {name: model directory}."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    built = {f"addk_{k}": build_addk(dest, k, padding_bytes) for k in range(1, synthetic + 1)}
    if sleep_ms is not None:
        built["sleep_ms"] = build_sleep(dest, sleep_ms)
    return built
