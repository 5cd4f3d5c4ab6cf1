"""Test models for NVIDIA Triton: a model repository of Python-backend models (no TF).

    build_triton_models(dest, synthetic=12, padding_bytes=0)   # addk_1..addk_12
    build_addk(dest, k, padding_bytes=50_000_000, name="addk_pad")
    build_sleep(dest, sleep_ms=300)

Every model is ``DEST/NAME/config.pbtxt`` plus ``DEST/NAME/1/model.py`` (version 1), with
``backend: "python"``, ``max_batch_size: 0`` and ``instance_group [{count: 1, kind:
KIND_CPU}]``, so each loaded model is one stub process (docs/upstream/triton.md, "Memory"). The config is
complete: Triton runs with ``--disable-auto-complete-config``.

* ``addk_K``: input ``x`` (TYPE_FP32, dims [-1]) -> output ``y`` = x + K (TYPE_FP32, dims
  [-1]). Parameter ``padding_bytes``: ``initialize()`` allocates and touches a uint8 array of
  that many bytes and keeps it while loaded, so the model's process really holds that memory
  and memory caps mean something.
* ``build_late_free``: an addk model whose memory outlives its unload: ``finalize()`` keeps
  its padding until a release file exists (memory released late, Triton server#4844).
* ``sleep_ms``: input ``x``/output ``y`` as addk (y = x); ``execute()`` sleeps the
  parameter ``sleep_ms`` milliseconds per request.
* ``stream_k`` (decoupled, ``model_transaction_policy { decoupled: true }``): for each request,
  ``K`` responses ``y = x + i`` (i = 0 .. K-1), ``delay_ms`` apart, then the final flag alone.
  A request whose ``x[0]`` is negative sends K = ``-x[0]`` responses instead. It checks
  ``response_sender.is_cancelled()`` before each response; a cancelled request stops and, with
  ``marker_dir`` set, writes ``MARKER_DIR/cancelled-<request id>`` (what tests read to see the
  cancellation reach the node).
* ``sparse`` (decoupled): a request whose ``x[0]`` is negative gets no response at all, only the
  final flag (a client sees nothing unless it asked for empty final responses); any other gets
  one response ``y = x``, final flag apart.
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


_STREAM_PY = '''\
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.k = int(parameters["k"]["string_value"])
        self.delay_s = int(parameters["delay_ms"]["string_value"]) / 1000.0
        self.marker_dir = parameters.get("marker_dir", {}).get("string_value", "")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            count = int(-x[0]) if x.size and x[0] < 0 else self.k
            for i in range(count):
                if i:
                    time.sleep(self.delay_s)
                if sender.is_cancelled():
                    if self.marker_dir:
                        path = os.path.join(self.marker_dir, "cancelled-" + (request.request_id() or "none"))
                        with open(path, "w") as marker:
                            marker.write(str(i))
                    break
                y = pb_utils.Tensor("y", (x + np.float32(i)).astype(np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[y]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_SPARSE_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if not (x.size and x[0] < 0):
                y = pb_utils.Tensor("y", x.astype(np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[y]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def model_config(name: str, parameters: dict[str, str], decoupled: bool = False) -> str:
    """config.pbtxt of a one-instance CPU python model with input x, output y (FP32 [-1])."""
    params = "".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
                     for key, value in parameters.items())
    return (f'name: "{name}"\n'
            'backend: "python"\n'
            'max_batch_size: 0\n'
            'input [{ name: "x" data_type: TYPE_FP32 dims: [-1] }]\n'
            'output [{ name: "y" data_type: TYPE_FP32 dims: [-1] }]\n'
            'instance_group [{ count: 1 kind: KIND_CPU }]\n'
            + ('model_transaction_policy { decoupled: true }\n' if decoupled else '')
            + params)


_LATE_FREE_PY = '''\
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.k = np.float32(float(parameters["k"]["string_value"]))
        self.release = parameters["release_file"]["string_value"]
        self.padding = np.ones(int(parameters["padding_bytes"]["string_value"]), dtype=np.uint8)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x + self.k).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses

    def finalize(self):
        padding, release = self.padding, self.release

        def hold():  # a non-daemon thread: the stub, and its memory, stay until it ends
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
            return padding.size

        threading.Thread(target=hold).start()
'''


_OOM_PY = '''\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

# PyTorch's words when CUDA runs out of memory (torch.cuda.OutOfMemoryError)
OOM = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
       "14.92 GiB already allocated; 3.75 MiB free; 15.01 GiB reserved in total by PyTorch)")


def short(path):
    """A test-controlled file says memory is short N more times: take one (True) if N > 0."""
    try:
        with open(path) as f:
            left = int(f.read() or "0")
    except FileNotFoundError:
        return False
    if left <= 0:
        return False
    with open(path + ".tmp", "w") as f:
        f.write(str(left - 1))
    os.replace(path + ".tmp", path)
    return True


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.k = np.float32(float(parameters["k"]["string_value"]))
        self.short = parameters["short_file"]["string_value"]
        if short(self.short + ".load"):
            raise RuntimeError(OOM)  # as torch.cuda.OutOfMemoryError (a RuntimeError) would

    def execute(self, requests):
        responses = []
        for request in requests:
            if short(self.short + ".infer"):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(OOM)))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x + self.k).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
'''


def write_model(dest: Path, name: str, source: str, parameters: dict[str, str], decoupled: bool = False) -> Path:
    """Write DEST/NAME/config.pbtxt and DEST/NAME/1/model.py; returns DEST/NAME."""
    model = Path(dest) / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text(source)
    (model / "config.pbtxt").write_text(model_config(name, parameters, decoupled))
    return model


def build_addk(dest: Path, k: int, padding_bytes: int = 0, name: str | None = None) -> Path:
    """``addk_K`` (or ``name``): y = x + k, holding ``padding_bytes`` while loaded."""
    return write_model(dest, name or f"addk_{k}", _ADDK_PY,
                       {"k": str(k), "padding_bytes": str(int(padding_bytes))})


def build_oom(dest: Path, k: int, short_file: Path, name: str) -> Path:
    """``name``: y = x + k, except that while ``SHORT_FILE.load`` holds N > 0 a load fails, and
    while ``SHORT_FILE.infer`` does a request fails, with PyTorch's CUDA out-of-memory text (N
    counts down by one a failure). It stands in for a model on a device that runs out of memory:
    the test says when memory is short."""
    return write_model(dest, name, _OOM_PY, {"k": str(k), "short_file": str(short_file)})


def build_sleep(dest: Path, sleep_ms: int, name: str = "sleep_ms") -> Path:
    """``sleep_ms`` (or ``name``): y = x after sleeping ``sleep_ms`` ms per request."""
    return write_model(dest, name, _SLEEP_PY, {"sleep_ms": str(int(sleep_ms))})


def build_stream(dest: Path, k: int, delay_ms: int, name: str | None = None, marker_dir: Path | None = None) -> Path:
    """``stream_K`` (or ``name``), decoupled: K responses y = x + i per request, ``delay_ms`` apart."""
    parameters = {"k": str(int(k)), "delay_ms": str(int(delay_ms))}
    if marker_dir is not None:
        parameters["marker_dir"] = str(marker_dir)
    return write_model(dest, name or f"stream_{k}", _STREAM_PY, parameters, decoupled=True)


def build_sparse(dest: Path, name: str = "sparse") -> Path:
    """``sparse`` (or ``name``), decoupled: no response for a request whose x[0] < 0, else one (y = x)."""
    return write_model(dest, name, _SPARSE_PY, {}, decoupled=True)


def build_late_free(dest: Path, k: int, padding_bytes: int, release_file: Path, name: str) -> Path:
    """``name``: y = x + k, holding ``padding_bytes`` while loaded and, after its unload, until
    ``release_file`` exists (at most 120 s): its stub stays, and Triton shows it UNLOADING, until then."""
    return write_model(dest, name, _LATE_FREE_PY, {"k": str(k), "padding_bytes": str(int(padding_bytes)),
                                                   "release_file": str(release_file)})


def build_triton_models(dest: Path, synthetic: int = 0, padding_bytes: int = 0,
                        sleep_ms: int | None = None) -> dict[str, Path]:
    """addk_1 .. addk_N (each padded by ``padding_bytes``) and, if ``sleep_ms`` is given,
    the sleep model; returns {name: model directory}."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    built = {f"addk_{k}": build_addk(dest, k, padding_bytes) for k in range(1, synthetic + 1)}
    if sleep_ms is not None:
        built["sleep_ms"] = build_sleep(dest, sleep_ms)
    return built


_GPU_STAND_IN_PY = '''\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.k = np.float32(float(parameters["k"]["string_value"]))
        self.marker = None
        if args["model_instance_name"].startswith("gpu_stand_in"):  # its own instance group
            gpu_dir = parameters["gpu_dir"]["string_value"]
            self.marker = os.path.join(gpu_dir, f"{args['model_name']}-{os.getpid()}")
            with open(self.marker, "w") as f:
                f.write(parameters["gpu_bytes"]["string_value"])

    def finalize(self):
        if self.marker is not None and os.path.exists(self.marker):
            os.remove(self.marker)

''' + _ADDK_PY[_ADDK_PY.index("    def execute"):]  # addk's execute(): y = x + k


def build_gpu_stand_in(dest: Path, k: int, gpu_dir: Path, gpu_bytes: int, name: str) -> Path:
    """``name``: y = x + k, a model that stands in for one on a GPU (this machine has none).

    Its own instance group is named ``gpu_stand_in``; each instance of that group writes
    ``GPU_DIR/NAME-PID`` holding ``gpu_bytes`` while it lives (finalize() removes it), so a test's
    GPU reading follows what Triton really did with the instances. Instances of any other group
    (a demotion's ``KIND_CPU`` override) write nothing: they hold no GPU memory. The own group
    also sets a rate-limiter priority (ignored: the server runs without rate limiting) so that
    its instances' settings differ from a demotion's, as KIND_GPU ones would: Triton's in-place
    update keeps an instance whose settings match the new group's and creates the others.
    """
    model = write_model(dest, name, _GPU_STAND_IN_PY,
                        {"k": str(k), "gpu_dir": str(gpu_dir), "gpu_bytes": str(int(gpu_bytes))})
    config = (model / "config.pbtxt").read_text().replace(
        "instance_group [{ count: 1 kind: KIND_CPU }]",
        'instance_group [{ name: "gpu_stand_in" count: 1 kind: KIND_CPU rate_limiter { priority: 1 } }]')
    (model / "config.pbtxt").write_text(config)
    return model
