#!/usr/bin/env python
"""Check demotion within a Triton node on a machine with a GPU: models leave the GPU for host
memory and come back, in place, under traffic, and NVML sees it (issue 32; docs/tiers.md,
"The GPU check").

    .venv/bin/pip install -e '.[gpu,triton]' torch      # or cupy-cuda12x
    .venv/bin/python scripts/check_gpu_tiers.py [--bytes 4GiB] [--out check_gpu_tiers.json]
    .venv/bin/python scripts/check_gpu_tiers.py --cpu-dry-run     # the same flow, no GPU

Runs ``tfscache serve --backend triton`` (one embedded node: the nvidia-pytriton wheel's
``tritonserver``, whose only backend is Python's) over a fresh repository of ``--models``
Python-backend models, ``tier_1`` .. ``tier_N`` (y = x + k). Each instance of a model's own group
(``KIND_GPU``) allocates ``--bytes`` of device memory with torch or cupy in ``initialize()``; an
instance of a demotion's ``KIND_CPU`` group holds ``--host-bytes`` of host memory instead. The
serve has ``cache.demote = "host"``, policy lru, and a GPU cap (``cache.gpu_memory_per_node``,
``--cap``, default 1.4 x (N-1) x ``--bytes``) that holds N-1 of the models. Client threads
(the official tritonclient, gRPC and HTTP in turn) call every loaded model throughout. Steps:

1. cold loads of tier_1 .. tier_N-1, one request each;
2. the cold load of tier_N: over the cap, an idle victim is demoted (its instances become
   ``KIND_CPU``, in place); its GPU memory goes and it keeps answering;
3. four requests at once on the demoted model, each held ``--hold-ms`` on the node (the queue
   rule, docs/tiers.md): it goes back to its own group on the GPU, and an idle GPU model is
   demoted to make room.

It reports NVML's used GPU memory before and after each step (the serve's process tree, each
model's stub process, and the devices' total), each model's cold load and moves in seconds
(``tfscache_load_duration_seconds``, ``tfscache_tier_move_duration_seconds``, per model), the
promotions against the cold load of the same model, the requests answered and failed, and the
/metrics counters ``tfscache_tier_moves_total`` and ``tfscache_tier_move_duration_seconds``: a
table on stdout, and one JSON document at ``--out``.

``--cpu-dry-run`` runs the whole flow on a machine without a GPU, and measures no GPU: the models'
own group is ``KIND_CPU``, named ``gpu_stand_in``, and each of its instances writes a file that
says it holds ``--bytes`` while it lives (the stand-in of tests/triton/test_triton_tiers.py). The
serve is this script run as ``--serve-stand-in DIR``: ``tfscache serve``'s own main, with a
reader in place of NVML that sums those files for the node's live processes, as NVML sums
memory per process. The script reads the same files for its report, and says it is a dry run.

Exit status 0 passed; 1 failed (a request failed, no demotion or no promotion, a move failed, a
promotion no faster than the cold load of its model, or a step not done within ``--timeout``);
2 this machine cannot run it (no GPU, NVML, torch or cupy, or Triton), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tfscache.kinds.gpumem import NvmlReader, process_tree  # noqa: E402
from tfscache.units import format_bytes, parse_bytes  # noqa: E402

STAND_IN_FLAG = "--serve-stand-in"  # internal: run as the dry run's serve (see the docstring)
STAND_IN_GROUP = "gpu_stand_in"
BURST = 4  # requests at once on a demoted model: PromoteRule.queue (tfscache/cache/tiers.py)
NODE = "(node)"  # GPU memory of the node's processes that are no model's stub

_MODEL_PY = '''\
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """y = x + k; a request whose x has a second element is held x[1] ms first."""

    def initialize(self, args):
        p = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.k = np.float32(float(p["k"]))
        self.block, self.marker = None, None
        if p["mode"] == "gpu" and "GPU" in args["model_instance_kind"]:
            device = int(args["model_instance_device_id"])
            if p["library"] == "torch":
                import torch
                self.block = torch.ones(int(p["gpu_bytes"]), dtype=torch.uint8, device=f"cuda:{device}")
                torch.cuda.synchronize(device)
            else:
                import cupy
                with cupy.cuda.Device(device):
                    self.block = cupy.ones(int(p["gpu_bytes"]), dtype=cupy.uint8)
                    cupy.cuda.runtime.deviceSynchronize()
        elif p["mode"] == "stand_in" and args["model_instance_name"].startswith("gpu_stand_in"):
            self.marker = os.path.join(p["gpu_dir"], f"{args['model_name']}-{os.getpid()}")
            with open(self.marker, "w") as f:
                f.write(p["gpu_bytes"])
        else:  # an instance on CPU: the model's weights in host memory
            self.block = np.ones(int(p["host_bytes"]), dtype=np.uint8)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.size > 1:
                time.sleep(float(x[1]) / 1000.0)
            y = pb_utils.Tensor("y", (x + self.k).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses

    def finalize(self):
        if self.marker is not None and os.path.exists(self.marker):
            os.remove(self.marker)
'''


class CannotCheck(Exception):
    """This machine cannot run the check (exit status 2)."""


class StepFailed(Exception):
    """A step did not come to pass within the time left (exit status 1)."""


# -- the models -----------------------------------------------------------------------------


def k_of(name: str) -> float:
    return float(name.rsplit("_", 1)[1])


def build_repository(root: Path, count: int, params: dict[str, str], dry_run: bool) -> list[str]:
    """``tier_1`` .. ``tier_COUNT`` under ``root``: on GPU, or on the dry run's stand-in group."""
    from support.models.triton import write_model

    group = (f'instance_group [{{ name: "{STAND_IN_GROUP}" count: 1 kind: KIND_CPU '
             'rate_limiter { priority: 1 } }]' if dry_run  # settings a demotion's group lacks
             else "instance_group [{ count: 1 kind: KIND_GPU gpus: [0] }]")
    names = [f"tier_{k}" for k in range(1, count + 1)]
    for name in names:
        model = write_model(root, name, _MODEL_PY, {**params, "k": str(k_of(name))})
        config = (model / "config.pbtxt").read_text()
        (model / "config.pbtxt").write_text(
            config.replace("instance_group [{ count: 1 kind: KIND_CPU }]", group))
    return names


def gpu_library() -> str:
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    raise CannotCheck("neither torch nor cupy is importable: the models have no way to allocate "
                      "device memory (pip install torch, or cupy-cuda12x)")


# -- GPU memory: NVML, or the dry run's stand-in files ----------------------------------------


class StandInReader:
    """The dry run's GpuReader (tfscache.kinds.gpumem): the bytes that files ``NAME-PID`` in
    ``gpu_dir`` say the processes ``pids`` hold, as NVML sums memory per process. ``by_model``
    puts them to models as NvmlModels does, by the stub's command line."""

    reason = ""

    def __init__(self, gpu_dir: Path) -> None:
        self.gpu_dir = Path(gpu_dir)

    def available(self) -> bool:
        return True

    def by_model(self, pids: Collection[int]) -> dict[str, int]:
        held: dict[str, int] = {}
        for path in self.gpu_dir.iterdir():
            try:
                pid = int(path.name.rpartition("-")[2])
                if pid in pids:
                    name = stub_model(pid)
                    held[name] = held.get(name, 0) + int(path.read_text() or 0)
            except (ValueError, FileNotFoundError):  # not a marker, or its instance just ended
                continue
        return held

    def used_by(self, pids: Collection[int]) -> int | None:
        return sum(self.by_model(set(pids)).values())

    def device_used(self) -> int | None:
        return None  # no device

    def close(self) -> None:
        pass


class NvmlModels:
    """NVML's used GPU memory per process of the serve's tree, put to the model whose Python
    stub each process is (its command line names the model's ``model.py``), and per device."""

    def __init__(self) -> None:
        self.reader = NvmlReader()  # starts NVML, or says why it cannot
        if not self.reader.available():
            raise CannotCheck(f"no GPU to check: {self.reader.reason}")
        import pynvml  # the module the reader started

        self.nvml = pynvml

    def by_model(self, pids: Collection[int]) -> dict[str, int]:
        held: dict[str, int] = {}
        nvml = self.nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index)):
                if process.pid in pids and process.usedGpuMemory:
                    name = stub_model(process.pid)
                    held[name] = held.get(name, 0) + int(process.usedGpuMemory)
        return held

    def device_used(self) -> int | None:
        nvml = self.nvml
        return sum(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(nvml.nvmlDeviceGetCount()))

    def close(self) -> None:
        self.reader.close()


def stub_model(pid: int) -> str:
    """The model whose Python-backend stub ``pid`` is (``.../NAME/VERSION/model.py`` on its
    command line), else ``NODE``."""
    import psutil

    try:
        for arg in psutil.Process(pid).cmdline():
            if arg.endswith("model.py"):
                return Path(arg).parent.parent.name
    except psutil.Error:
        pass
    return NODE


def serve_stand_in(gpu_dir: Path, argv: list[str]) -> int:
    """The dry run's serve: ``tfscache serve`` with StandInReader in place of NVML. Its cap needs
    no pynvml, so the [gpu] extra's check is told it has none to find."""
    from tfscache import extras
    from tfscache.app import host
    from tfscache.cli.serve import main as serve_main

    host.NvmlReader = lambda: StandInReader(gpu_dir)
    extras.EXTRAS["gpu"] = ()
    return serve_main(argv)


# -- the serve ------------------------------------------------------------------------------


class Serve:
    """``tfscache serve`` as a child process: its ports, /status and /metrics."""

    def __init__(self, argv: list[str], directory: Path, deadline: float) -> None:
        self.log_path = directory / "serve.log"
        ports_file = directory / "ports.json"
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([*argv, "--ports-file", str(ports_file)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=ROOT, env=env)

        def serving() -> bool:
            if self.process.poll() is not None:
                raise StepFailed(f"tfscache serve exited with {self.process.returncode} before "
                                 f"serving:\n{self.log_tail()}")
            return ports_file.exists()

        wait_until("tfscache serve serving", serving, deadline)
        ports = json.loads(ports_file.read_text())
        self.pid = self.process.pid
        self.grpc_target, self.http_target = f"127.0.0.1:{ports['grpc']}", f"127.0.0.1:{ports['rest']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}"

    def node(self) -> dict:
        """/status's entry of the one local node."""
        with urllib.request.urlopen(f"{self.metrics_url}/status", timeout=10) as reply:
            return json.load(reply)["nodes"][0]

    def tiers(self) -> dict[str, str]:
        """Each model in the node's config: its tier, ``gpu->host`` while it moves."""
        return {m["name"]: m["tier"] + (f"->{m['moving']}" if m["moving"] else "")
                for m in self.node()["models"] if m["state"] == "available"}

    def metrics(self) -> list[tuple[str, dict, float]]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
                for s in family.samples if s.name.startswith(("tfscache_tier_", "tfscache_load_duration"))]

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def wait_until(what: str, ready: Callable[[], object], deadline: float, interval: float = 0.05):
    """Poll ``ready()`` until truthy (a script watching other processes: nothing to wait on)."""
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise StepFailed(f"{what}: not within --timeout")
        time.sleep(interval)
    return value


# -- requests -------------------------------------------------------------------------------


class Client:
    """One official tritonclient, gRPC or HTTP, that checks each answer (y = x + k)."""

    def __init__(self, serve: Serve, http: bool, timeout_s: float) -> None:
        if http:
            import tritonclient.http as module
            self.client = module.InferenceServerClient(serve.http_target, connection_timeout=timeout_s,
                                                       network_timeout=timeout_s)
        else:
            import tritonclient.grpc as module
            self.client = module.InferenceServerClient(serve.grpc_target)
        self.module, self.http, self.timeout_s = module, http, timeout_s

    def infer(self, name: str, x: list[float]) -> None:
        import numpy as np

        tensor = self.module.InferInput("x", [len(x)], "FP32")
        tensor.set_data_from_numpy(np.array(x, dtype=np.float32))
        kwargs = {} if self.http else {"client_timeout": self.timeout_s}
        y = self.client.infer(name, [tensor], **kwargs).as_numpy("y").tolist()
        if y != [v + k_of(name) for v in x]:
            raise AssertionError(f"{name}: x = {x}, y = {y}")

    def close(self) -> None:
        self.client.close()


class Requests:
    """Every request the check sends, counted: answers and the slowest answer per model, and
    each failure's text."""

    def __init__(self) -> None:
        self.answers: dict[str, int] = {}
        self.slowest_s: dict[str, float] = {}
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def send(self, client: Client, name: str, x: list[float]) -> bool:
        start = time.monotonic()
        try:
            client.infer(name, x)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            with self._lock:
                self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            return False
        seconds = time.monotonic() - start
        with self._lock:
            self.answers[name] = self.answers.get(name, 0) + 1
            if len(x) == 1:  # not a held request
                self.slowest_s[name] = max(seconds, self.slowest_s.get(name, 0.0))
        return True


class Traffic:
    """Client threads (gRPC and HTTP in turn) that each call the loaded models in turn, one
    request every ``pause_s``, until stopped. ``models`` grows as steps load them."""

    def __init__(self, serve: Serve, requests: Requests, clients: int, pause_s: float,
                 timeout_s: float) -> None:
        self.serve, self.requests, self.pause_s, self.timeout_s = serve, requests, pause_s, timeout_s
        self.models: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 10)

    def _run(self, worker: int) -> None:
        try:
            client = Client(self.serve, http=worker % 2 == 1, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - counted as a failed request
            self.requests.failures.append(f"client {worker}: {type(exc).__name__}: {exc}")
            return
        try:
            i = 0
            while not self._stop.wait(self.pause_s):  # the pace of a steady client, not a wait
                models = list(self.models)
                if models:
                    self.requests.send(client, models[(worker + i) % len(models)], [float(i)])
                    i += 1
        finally:
            client.close()


def burst(serve: Serve, requests: Requests, name: str, hold_ms: float, timeout_s: float
          ) -> list[threading.Thread]:
    """``BURST`` gRPC requests on ``name`` sent at once, each held ``hold_ms`` on the node (one
    instance runs them in turn, so all are in flight together); started, not joined."""
    barrier = threading.Barrier(BURST)

    def one(i: int) -> None:
        client = Client(serve, http=False, timeout_s=timeout_s)
        try:
            barrier.wait(timeout_s)
            requests.send(client, name, [float(i), hold_ms])
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(BURST)]
    for thread in threads:
        thread.start()
    return threads


# -- the check ------------------------------------------------------------------------------


class Check:
    """The steps against one serve, and what each saw."""

    def __init__(self, serve: Serve, gpu, names: list[str], args: argparse.Namespace) -> None:
        self.serve, self.gpu, self.names, self.args = serve, gpu, names, args
        self.deadline = time.monotonic() + args.timeout
        self.requests = Requests()
        self.traffic = Traffic(serve, self.requests, args.clients, args.pause_ms / 1000.0, args.timeout)
        self.steps: list[dict] = []
        self.demoted: list[str] = []
        self.promoted: list[str] = []

    def reading(self) -> dict:
        held = self.gpu.by_model(process_tree(self.serve.pid))
        cache = self.serve.node()["gpu"] or {}  # null while the node is down
        return {"node_bytes": sum(held.values()), "by_model": dict(sorted(held.items())),
                "device_used_bytes": self.gpu.device_used(), "cache_gpu_bytes": cache.get("bytes")}

    def step(self, what: str, action: Callable[[], object]) -> object:
        before, start = self.reading(), time.monotonic()
        row = {"step": what, "before": before}
        self.steps.append(row)
        result = action()
        row.update(seconds=round(time.monotonic() - start, 3), after=self.reading(), tiers=self.serve.tiers())
        return result

    def run(self) -> None:
        self.step("serve started", lambda: None)
        client = Client(self.serve, http=False, timeout_s=self.args.timeout)
        try:
            for name in self.names[:-1]:
                self.step(f"cold load {name}", lambda name=name: self.cold_load(client, name))
                self.traffic.models.append(name)
            self.traffic.start()
            last = self.names[-1]
            victim = self.step(f"cold load {last}: over the cap, a victim demoted",
                               lambda: self.load_over_cap(client, last))
            on_host = self.settled_on_host() or victim  # the rules may have moved others since
            self.step(f"{BURST} requests at once on {on_host}: promoted", lambda: self.promote(on_host))
        finally:
            self.traffic.stop()
            client.close()

    def cold_load(self, client: Client, name: str) -> None:
        if not self.requests.send(client, name, [0.0]):
            raise StepFailed(f"the cold load of {name} failed: {self.requests.failures[-1]}")
        wait_until(f"{name} on the GPU", lambda: self.settled_on_gpu(name), self.deadline)

    def load_over_cap(self, client: Client, name: str) -> str:
        self.cold_load(client, name)
        self.traffic.models.append(name)
        victim = wait_until("a victim demoted, its GPU memory given back", self.settled_on_host,
                            self.deadline)
        self.demoted.append(victim)
        answered = self.requests.answers.get(victim, 0)
        wait_until(f"{victim} answering from host memory",
                   lambda: self.requests.answers.get(victim, 0) > answered, self.deadline)
        return victim

    def promote(self, name: str) -> None:
        self.steps[-1]["on_host_at_burst"] = self.serve.tiers().get(name) == "host"
        threads = burst(self.serve, self.requests, name, self.args.hold_ms, self.args.timeout)
        wait_until(f"{name} back on the GPU", lambda: self.settled_on_gpu(name), self.deadline)
        self.promoted.append(name)
        room = wait_until("another model off the GPU to make room", lambda: self.room_made(name),
                          self.deadline)
        self.steps[-1]["room_made_by"] = room
        self.demoted += [m for m, how in room.items() if how == "demoted"]
        for thread in threads:
            thread.join(max(0.0, self.deadline - time.monotonic()))

    def on_gpu(self, held: dict[str, int], name: str) -> bool:
        """Whether ``name``'s stubs hold its GPU bytes: at least half of ``--bytes`` (a CPU
        instance's stub may still hold a CUDA context, never the model's block)."""
        return held.get(name, 0) >= self.args.bytes // 2

    def settled_on_gpu(self, name: str) -> bool:
        """``name`` on the GPU tier, not moving, its stubs holding its GPU bytes."""
        held = self.gpu.by_model(process_tree(self.serve.pid))
        return self.on_gpu(held, name) and self.serve.tiers().get(name) == "gpu"

    def room_made(self, name: str) -> dict[str, str]:
        """The other models that do not hold their GPU bytes now: "demoted" (on the host tier) or
        "unloaded" (a victim is unloaded instead when its promotion would be no faster than its
        cold load: demote_pays, docs/tiers.md)."""
        held, tiers = self.gpu.by_model(process_tree(self.serve.pid)), self.serve.tiers()
        return {m: "demoted" if tiers.get(m, "").startswith("host") else "unloaded"
                for m in self.names if m != name and not self.on_gpu(held, m)}

    def settled_on_host(self, exclude: str = "") -> str | None:
        """A model on the host tier, not moving, that does not hold its GPU bytes now."""
        held = self.gpu.by_model(process_tree(self.serve.pid))
        return next((name for name, tier in self.serve.tiers().items()
                     if tier == "host" and name != exclude and not self.on_gpu(held, name)), None)


def moves(samples: list[tuple[str, dict, float]]) -> dict:
    """/metrics' tier counters by ``to``, and per model: loads' and moves' count and seconds."""
    totals: dict[str, dict[str, float]] = {}
    models: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        what = name.removeprefix("tfscache_")
        if what.endswith("_bucket"):
            continue
        key = what + (f"{{to={labels['to']}}}" if "to" in labels else "")
        totals[key] = totals.get(key, 0.0) + value
        per = models.setdefault(labels.get("model", ""), {})
        per[key] = per.get(key, 0.0) + value
    return {"totals": totals, "models": models}


def mean(values: dict[str, float], family: str) -> float | None:
    count = values.get(family.replace("{", "_count{") if "{" in family else family + "_count", 0.0)
    total = values.get(family.replace("{", "_sum{") if "{" in family else family + "_sum", 0.0)
    return total / count if count else None


def verdict(check: Check, metrics: dict, failed_step: str, timed: bool) -> tuple[list[str], list[dict]]:
    """The reasons the check failed ([]: passed), and each promoted model's promotions (their
    mean) against its cold load; ``timed``: a promotion no faster fails the check (not in the dry
    run, where both are a CPU stub starting and say nothing of a GPU's)."""
    totals, problems, versus = metrics["totals"], [], []
    if failed_step:
        problems.append(failed_step)
    if check.requests.failures:
        problems.append(f"{len(check.requests.failures)} request(s) failed")
    for to, what in (("host", "demotion"), ("gpu", "promotion")):
        if not totals.get(f"tier_moves_total{{to={to}}}"):
            problems.append(f"no {what} in tfscache_tier_moves_total")
        if totals.get(f"tier_move_failures_total{{to={to}}}"):
            problems.append(f"a {what} failed (tfscache_tier_move_failures_total)")
    for model, values in sorted(metrics["models"].items()):
        promote = mean(values, "tier_move_duration_seconds{to=gpu}")
        load = mean(values, "load_duration_seconds")
        if promote is None:
            continue
        faster = load is not None and promote < load
        versus.append({"model": model, "promote_s": round(promote, 3),
                       "cold_load_s": None if load is None else round(load, 3), "faster": faster})
        if timed and not faster:
            problems.append(f"{model}: promotion {promote:.3f} s, no faster than its cold load "
                            f"({'not measured' if load is None else f'{load:.3f} s'})")
    return problems, versus


# -- the report -----------------------------------------------------------------------------


def table(report: dict) -> str:
    def size(n: int | None) -> str:
        return "-" if n is None else format_bytes(n)

    lines = [report["what"], "",
             f"{'step':<46} {'GPU before':>11} {'GPU after':>11} {'device after':>12} {'s':>7}  "
             "tiers after / GPU by model"]
    for row in report["steps"]:
        after = row.get("after") or {}
        held = ", ".join(f"{m}={format_bytes(b)}" for m, b in after.get("by_model", {}).items())
        tiers = " ".join(f"{m}={t}" for m, t in sorted(row.get("tiers", {}).items()))
        lines.append(f"{row['step']:<46} {size(row['before']['node_bytes']):>11} "
                     f"{size(after.get('node_bytes')):>11} {size(after.get('device_used_bytes')):>12} "
                     f"{row.get('seconds', float('nan')):>7.2f}  {tiers or '-'} / {held or '-'}")
    for row in report["steps"]:
        if "on_host_at_burst" in row:
            lines.append(f"  {row['step']}: on the host tier when sent: "
                         + ("yes" if row["on_host_at_burst"] else "no (the rules had moved it already)"))
        if row.get("room_made_by"):
            made = row["room_made_by"].items()
            lines.append("  room made by: " + ", ".join(f"{m} {how}" for m, how in made))
    lines.append("")
    for v in report["promotion_vs_cold_load"]:
        lines.append(f"{v['model']}: promotion {v['promote_s']:.3f} s, cold load {v['cold_load_s']} s: "
                     + ("faster" if v["faster"] else "NOT faster")
                     + ("" if report["promotion_gated"] else " (dry run: reported, not checked)"))
    requests = report["requests"]
    slowest = ", ".join(f"{m} {v:.3f} s" for m, v in requests["slowest_s"].items())
    lines.append(f"requests: {requests['answered']} answered, {requests['failed']} failed; "
                 f"slowest answer: {slowest or '-'}")
    for failure in requests["failures"][:5]:
        lines.append(f"  {failure}")
    lines.append("/metrics: " + ", ".join(f"{k} {v:g}" for k, v in sorted(report["metrics"]["totals"].items())
                                           if "tier_move" in k))
    lines.append(("PASSED" if report["passed"] else "FAILED: " + "; ".join(report["problems"]))
                 + (" (a dry run on CPU with a stand-in for GPU memory: not a GPU measurement)"
                    if report["dry_run"] else ""))
    return "\n".join(lines)


def serve_argv(args: argparse.Namespace, repository: Path, state_dir: Path, cap: int,
               gpu_dir: Path | None) -> list[str]:
    head = ([sys.executable, str(Path(__file__).resolve()), STAND_IN_FLAG, str(gpu_dir)] if gpu_dir
            else [sys.executable, "-m", "tfscache", "serve"])
    return [*head, "--backend", "triton", "--model-repository", str(repository), "--local-nodes", "1",
            "--grpc-port", "0", "--rest-port", "0", "--metrics-port", "0", "--bind-address", "127.0.0.1",
            "--gpu-memory-per-node", str(cap), "--set", "cache.demote=host", "--set", "cache.policy=lru",
            "--set", "server.metrics_per_model=true", "--set", f"node.state_dir={state_dir}",
            "--set", f"cache.reload_deadline_s={args.timeout}"]


def run(args: argparse.Namespace) -> dict:
    from tfscache.kinds.triton.launcher import TritonNotFound, find_tritonserver

    try:
        find_tritonserver()
    except TritonNotFound as exc:
        raise CannotCheck(f"no Triton: {exc}") from exc
    count = args.models
    cap = args.cap or int(1.4 * (count - 1) * args.bytes)
    with tempfile.TemporaryDirectory(prefix="tfscache-gpu-tiers-") as tmp:
        tmp = Path(tmp)
        gpu_dir = tmp / "gpu" if args.cpu_dry_run else None
        if gpu_dir is not None:
            gpu_dir.mkdir()
            gpu, params = StandInReader(gpu_dir), {"mode": "stand_in", "gpu_dir": str(gpu_dir)}
        else:
            gpu = NvmlModels()  # first: no GPU is the likeliest reason it cannot run
            try:
                params = {"mode": "gpu", "library": gpu_library()}
            except CannotCheck:
                gpu.close()
                raise
        try:
            params.update(gpu_bytes=str(args.bytes), host_bytes=str(args.host_bytes))
            names = build_repository(tmp / "repository", count, params, args.cpu_dry_run)
            serve = Serve(serve_argv(args, tmp / "repository", tmp / "state", cap, gpu_dir), tmp,
                          time.monotonic() + args.timeout)
            check, failed_step = Check(serve, gpu, names, args), ""
            try:
                check.run()
            except (StepFailed, OSError) as exc:  # OSError: the serve stopped answering
                failed_step = str(exc)
                print(f"check_gpu_tiers: {exc}\n--- serve log ---\n{serve.log_tail()}", file=sys.stderr)
            finally:
                alive = serve.process.poll() is None
                metrics = moves(serve.metrics()) if alive else {"totals": {}, "models": {}}
                serve.stop()
        finally:
            gpu.close()
    problems, versus = verdict(check, metrics, failed_step, timed=not args.cpu_dry_run)
    what = ("CPU DRY RUN: no GPU here. The models' instances are KIND_CPU standing in for GPU ones, and "
            f"'GPU' memory is the stand-in files they write ({format_bytes(args.bytes)} each), "
            "not an NVML measurement." if args.cpu_dry_run else
            f"GPU check: NVML's used GPU memory; models of {format_bytes(args.bytes)} ({params['library']})")
    return {"what": what, "dry_run": args.cpu_dry_run,
            "gpu_reading": "stand-in files" if args.cpu_dry_run else "nvml",
            "models": names, "model_bytes": args.bytes, "cap_bytes": cap, "steps": check.steps,
            "demoted": check.demoted, "promoted": check.promoted, "promotion_vs_cold_load": versus,
            "requests": {"answered": sum(check.requests.answers.values()), "by_model": check.requests.answers,
                         "slowest_s": {m: round(v, 3) for m, v in sorted(check.requests.slowest_s.items())},
                         "failed": len(check.requests.failures), "failures": check.requests.failures[:20]},
            "promotion_gated": not args.cpu_dry_run,
            "metrics": metrics, "problems": problems, "passed": not problems}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [STAND_IN_FLAG]:
        return serve_stand_in(Path(argv[1]), argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="no GPU: CPU instances stand in for GPU ones, files for NVML "
                        "(not a GPU measurement)")
    parser.add_argument("--models", type=int, default=3,
                        help="models served (the cap holds one fewer); at least 2")
    parser.add_argument("--bytes", type=parse_bytes, default=parse_bytes("4GiB"),
                        help="GPU memory each model's GPU instance allocates (default 4GiB)")
    parser.add_argument("--host-bytes", type=parse_bytes, default=0,
                        help="host memory each model's CPU instance holds (default 0)")
    parser.add_argument("--cap", type=parse_bytes, default=0,
                        help="cache.gpu_memory_per_node (default 1.4 x (models - 1) x --bytes)")
    parser.add_argument("--clients", type=int, default=4, help="client threads of steady traffic")
    parser.add_argument("--pause-ms", type=float, default=100.0, help="each client's pause between requests")
    parser.add_argument("--hold-ms", type=float, default=300.0,
                        help="how long the node holds each of the requests that bring a model back")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds the whole check may take")
    parser.add_argument("--out", default="check_gpu_tiers.json", help="the JSON document of results")
    args = parser.parse_args(argv)
    if args.models < 2:
        parser.error("--models must be at least 2")
    try:
        report = run(args)
    except CannotCheck as exc:
        print(f"check_gpu_tiers: cannot check here: {exc}", file=sys.stderr)
        return 2
    except StepFailed as exc:  # the serve did not start
        print(f"check_gpu_tiers: FAILED: {exc}", file=sys.stderr)
        Path(args.out).write_text(json.dumps({"dry_run": args.cpu_dry_run, "problems": [str(exc)],
                                              "passed": False}, indent=2) + "\n")
        return 1
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"results: {args.out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
