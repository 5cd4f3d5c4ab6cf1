#!/usr/bin/env python
"""Check the GPU memory reader on a machine with a GPU: a Triton model's load shows as growth.

    .venv/bin/pip install -e '.[gpu,triton]'      # nvidia-ml-py, and Triton (docs/triton.md)
    .venv/bin/python scripts/check_gpu_memory.py [--bytes 512MiB] [--json]

Starts ``tritonserver`` (tfscache.kinds.triton.launcher) on a fresh model repository holding one
Python-backend model, ``gpu_alloc``, whose ``initialize()`` allocates and fills ``--bytes``
of device memory with torch or cupy (whichever imports here; the backend's stub runs this
environment's Python). Then, reading the node's process tree through NVML
(tfscache.kinds.gpumem, as the cache does):

1. before the load;
2. after ``POST /v2/repository/models/gpu_alloc/load``: the growth must be at least the
   bytes asked for (the CUDA context of the model's process comes on top);
3. after the unload: the model's process is gone, so the tree's GPU memory falls back.

Prints each reading and the verdict; ``--json`` prints them as one object. Exit status 0
when the reader saw the growth and the release, 1 when it did not, 2 when this machine
cannot run the check: no GPU (or no NVML, or no nvidia-ml-py), no torch or cupy, or no
Triton — the message says which.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from tfscache.kinds.gpumem import NvmlReader, process_tree  # noqa: E402
from tfscache.units import parse_bytes  # noqa: E402

MODEL = "gpu_alloc"
_MODEL_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"])["parameters"]
        size = int(params["gpu_bytes"]["string_value"])
        if params["library"]["string_value"] == "torch":
            import torch
            self.block = torch.ones(size, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        else:
            import cupy
            self.block = cupy.ones(size, dtype=cupy.uint8)
            cupy.cuda.runtime.deviceSynchronize()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", x.astype(np.float32))]))
        return responses
'''


class CannotCheck(Exception):
    """This machine cannot run the check (exit status 2)."""


def gpu_library() -> str:
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    raise CannotCheck("neither torch nor cupy is importable: the model has no way to allocate device memory "
                      "(pip install torch, or cupy-cuda12x)")


def http(port: int, method: str, path: str, timeout: float = 120.0) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_until(what: str, ready, timeout_s: float) -> None:
    """Poll ``ready()`` every 0.1 s (a script watching another process: nothing to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(0.1)


def start_triton(repository: Path) -> tuple[subprocess.Popen, int]:
    from tfscache.kinds.supervisor import free_port
    from tfscache.kinds.triton.launcher import TritonNotFound, command, find_tritonserver

    try:
        binary = find_tritonserver()
    except TritonNotFound as exc:
        raise CannotCheck(f"no Triton: {exc}") from exc
    http_port = free_port()
    argv, env = command(binary, repository, http_port=http_port, grpc_port=free_port(), metrics_port=free_port())
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)

    def live() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with status {process.returncode}")
        try:
            return http(http_port, "GET", "/v2/health/live", timeout=2.0) == 200
        except OSError:
            return False

    wait_until("tritonserver serving", live, 120.0)
    return process, http_port


def check(size: int) -> dict:
    reader = NvmlReader()
    if not reader.available():
        raise CannotCheck(f"no GPU to check: {reader.reason}")
    library = gpu_library()
    from support.models.triton import write_model

    with tempfile.TemporaryDirectory(prefix="tfscache-gpu-") as tmp:
        write_model(Path(tmp), MODEL, _MODEL_PY, {"gpu_bytes": str(size), "library": library})
        process, port = start_triton(Path(tmp))
        try:
            def used() -> int:
                value = reader.used_by(process_tree(process.pid))  # the tree anew: the stub is a new child
                if value is None:
                    raise RuntimeError(f"NVML read failed: {reader.reason or 'see the log'}")
                return value

            before = used()
            status = http(port, "POST", f"/v2/repository/models/{MODEL}/load", timeout=600.0)
            if status != 200:
                raise RuntimeError(f"loading {MODEL}: HTTP {status}")
            loaded = used()
            http(port, "POST", f"/v2/repository/models/{MODEL}/unload", timeout=600.0)
            try:
                wait_until("the model's GPU memory released", lambda: used() < loaded - size // 2, 60.0)
            except TimeoutError:
                pass  # reported below as not released
            unloaded = used()
        finally:
            process.terminate()
            process.wait(timeout=60)
    grew, released = loaded - before, loaded - unloaded
    return {"library": library, "asked": size, "before": before, "loaded": loaded, "unloaded": unloaded,
            "growth": grew, "released": released, "ok": grew >= size and released >= size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", default="512MiB", type=parse_bytes, help="device memory the model allocates")
    parser.add_argument("--json", action="store_true", help="print the readings as one JSON object")
    args = parser.parse_args(argv)
    try:
        result = check(args.bytes)
    except CannotCheck as exc:
        print(f"check_gpu_memory: cannot check here: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        for key in ("library", "asked", "before", "loaded", "unloaded", "growth", "released"):
            print(f"{key:>9}: {result[key]}")
        print("OK: NVML saw the model's device memory come and go" if result["ok"]
              else "FAILED: the growth or the release is less than the bytes the model allocated")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
