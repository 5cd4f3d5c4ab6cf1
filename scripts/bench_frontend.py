#!/usr/bin/env python
"""Benchmark: warm Predict through `tfscache serve` versus straight to the node, same run.

    .venv/bin/python scripts/bench_frontend.py [--requests 2000] [--seconds 10] [--out results.json]

1. Builds half_plus_two and ``slow_5ms`` (a graph of chained 256x256 matmuls taking
   about 5 ms per call, calibrated here) into a temporary repository.
2. Starts ``tfscache serve --local-nodes 1`` and reads its node's ports, so "direct" and
   "through the front end" hit the same node process.
3. Per model, warm-up, then at concurrency 1 it alternates blocks of requests direct / via
   the front end and reports p50/p99 of each and the difference; at concurrency 16 it
   runs each path for ``--seconds`` and reports throughput and the ratio.
4. Front-end RSS and start-up time with 10,000 model directories in the repository
   (sidecar mode against the already running node, so start-up is the front end's own).

Clients send pre-serialized request bytes over raw channels, so the client's own cost is
as small as Python allows; client, front end and node share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PYTHON = sys.executable
PREDICT = "/tensorflow.serving.PredictionService/Predict"


def build_models(root: Path) -> None:
    """half_plus_two (TF Serving's) and slow_5ms, in a child process (it imports tensorflow)."""
    code = f"""
import time
from pathlib import Path
import numpy as np
import tensorflow as tf
from tfscache.node import testmodels
tf1 = tf.compat.v1
root = Path({str(root)!r})
testmodels._build_half_plus_two(root / "half_plus_two")

def graph(n):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, shape=None, name="x")
        w = tf.constant(np.random.RandomState(0).rand(256, 256).astype("float32") / 256)
        w = w + 0.0 * tf.reduce_sum(x)  # depends on the input: no constant folding of the chain
        h = w
        for _ in range(n):
            h = tf.matmul(h, w)
        y = tf.identity(x + 0.0 * tf.reduce_sum(h), name="y")
    return g, x, y

def per_call(n):
    g, x, y = graph(n)
    with tf1.Session(graph=g, config=tf1.ConfigProto(intra_op_parallelism_threads=1)) as s:
        for _ in range(5): s.run(y, {{x: [1.0]}})
        t = time.perf_counter()
        for _ in range(40): s.run(y, {{x: [1.0]}})
        return (time.perf_counter() - t) / 40

n = max(1, round(0.005 / (per_call(16) / 16)))  # matmuls for ~5 ms
g, x, y = graph(n)
with g.as_default(), tf1.Session(graph=g) as s:
    sig = testmodels._signature({{"x": x}}, {{"y": y}}, testmodels.PREDICT)
    testmodels._save_graph(s, root / "slow_5ms" / "1", {{"serving_default": sig}})
print(n)
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    print(f"built models ({out.stdout.strip()} chained matmuls in slow_5ms)", file=sys.stderr)


def predict_bytes(name: str) -> bytes:
    """PredictRequest{model_spec{name}, inputs{x: float [1]: 2.0}} on the wire."""
    from tfscache.wire import serving_pb2  # spec only; build the rest by hand to avoid tensorflow

    spec = serving_pb2.SpecHead(model_spec=serving_pb2.ModelSpec(name=name)).SerializeToString()
    # TensorProto{dtype=DT_FLOAT(1), tensor_shape{dim{size:1}}, float_val=[2.0]}
    tensor = b"\x08\x01" + b"\x12\x04\x12\x02\x08\x01" + b"\x2a\x04" + b"\x00\x00\x00\x40"
    entry = b"\x0a\x01x" + b"\x12" + bytes([len(tensor)]) + tensor
    return spec + b"\x12" + bytes([len(entry)]) + entry


def start_serve(repo: Path, workdir: Path, *args: str) -> tuple[subprocess.Popen, dict, float]:
    ports_file = workdir / f"ports-{time.monotonic_ns()}.json"
    started = time.monotonic()
    log = open(workdir / "serve.log", "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "serve", "--model-repository", str(repo),
                                "--grpc-port", "0", "--rest-port", "0", "--bind-address", "127.0.0.1",
                                "--ports-file", str(ports_file), "--log-level", "WARNING", *args],
                               cwd=REPO, stdout=log, stderr=log)
    while not ports_file.exists():
        if process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode}; see {workdir / 'serve.log'}")
        time.sleep(0.005)
    return process, json.loads(ports_file.read_text()), time.monotonic() - started


def latency_c1(targets: dict[str, str], request: bytes, n: int, block: int = 50) -> dict[str, list[float]]:
    calls = {}
    for label, target in sorted(targets.items(), key=lambda item: item[0] != "frontend"):  # loads first
        channel = grpc.insecure_channel(target)
        calls[label] = channel.unary_unary(PREDICT)
        for _ in range(50):  # warm: load, connections, caches
            calls[label](request, timeout=60)
    samples = {label: [] for label in targets}
    for _ in range(n // block):  # alternate blocks so drift hits both paths alike
        for label, call in calls.items():
            for _ in range(block):
                t = time.perf_counter()
                call(request, timeout=60)
                samples[label].append(time.perf_counter() - t)
    return samples


async def _throughput(target: str, request: bytes, concurrency: int, seconds: float) -> float:
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(PREDICT)
        for _ in range(20):
            await call(request, timeout=60)
        done = 0
        stop = time.monotonic() + seconds

        async def worker():
            nonlocal done
            while time.monotonic() < stop:
                await call(request, timeout=60)
                done += 1

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - start)


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def bench_model(name: str, targets: dict[str, str], n: int, seconds: float, pids: dict[str, int]) -> dict:
    request = predict_bytes(name)
    s = latency_c1(targets, request, n)
    result = {"model": name, "requests_c1": len(s["direct"])}
    for label in targets:
        result[f"{label}_p50_ms"] = pct(s[label], 50) * 1e3
        result[f"{label}_p99_ms"] = pct(s[label], 99) * 1e3
        result[f"{label}_mean_ms"] = statistics.fmean(s[label]) * 1e3
    result["added_p50_ms"] = result["frontend_p50_ms"] - result["direct_p50_ms"]
    result["added_p99_ms"] = result["frontend_p99_ms"] - result["direct_p99_ms"]
    for label, target in targets.items():
        cpu = {who: _cpu(pid) for who, pid in pids.items()}
        rps = asyncio.run(_throughput(target, request, 16, seconds))
        result[f"{label}_rps_c16"] = rps
        for who, pid in pids.items():  # CPU time per request of each process on this path
            result[f"{label}_c16_{who}_cpu_us_per_request"] = (_cpu(pid) - cpu[who]) / (rps * seconds) * 1e6
    result["throughput_ratio_c16"] = result["frontend_rps_c16"] / result["direct_rps_c16"]
    return result


def start_node(workdir: Path) -> tuple[subprocess.Popen, dict]:
    """A bare `tfscache node` (empty config) for the sidecar start-up runs."""
    config, ports_file = workdir / "node.config", workdir / "node.ports.json"
    config.write_text("model_config_list {\n}\n")
    log = open(workdir / "node.log", "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "node", "--port=0", "--rest_api_port=0",
                                "--bind_address=127.0.0.1", f"--ports_file={ports_file}",
                                f"--model_config_file={config}", "--file_system_poll_wait_seconds=0.1",
                                "--max_num_load_retries=0", "--num_load_threads=2"],
                               cwd=REPO, stdout=log, stderr=log)
    while not ports_file.exists():
        if process.poll() is not None:
            raise SystemExit(f"node exited with {process.returncode}; see {workdir / 'node.log'}")
        time.sleep(0.05)
    return process, json.loads(ports_file.read_text())


def bench_startup(workdir: Path, models: int) -> dict:
    repo = workdir / "many"
    for i in range(models):
        (repo / f"model_{i:05d}" / "1").mkdir(parents=True, exist_ok=True)
    node_process, node = start_node(workdir)
    try:
        return _startup_runs(repo, workdir, models, node["grpc"], node["rest"])
    finally:
        node_process.send_signal(signal.SIGTERM)
        node_process.wait(60)


def _startup_runs(repo: Path, workdir: Path, models: int, node_grpc: int, node_rest: int) -> dict:
    runs = []
    for _ in range(3):
        process, ports, elapsed = start_serve(repo, workdir, "--node-address",
                                              f"127.0.0.1:{node_grpc},{node_rest}", "--name", "bench")
        rss = psutil.Process(process.pid).memory_info().rss
        # a request for one of the 10,000 models works (it is found on demand, not at start-up)
        with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
            try:
                channel.unary_unary(PREDICT)(predict_bytes("model_04242"), timeout=30)
                found = "OK"
            except grpc.RpcError as exc:  # an empty version dir: the node cannot load it
                found = f"{exc.code().name}: {exc.details()[:120]}"
        rss_after = psutil.Process(process.pid).memory_info().rss
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        runs.append((elapsed, rss, rss_after, found))
    return {"models_in_repository": models, "startup_s": [round(r[0], 3) for r in runs],
            "rss_mb_at_ready": [round(r[1] / 2**20, 1) for r in runs],
            "rss_mb_after_a_request": [round(r[2] / 2**20, 1) for r in runs],
            "request_for_an_empty_model_dir": runs[0][3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per path at concurrency 1")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per path at concurrency 16")
    parser.add_argument("--models", type=int, default=10_000, help="model directories for the start-up test")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        build_models(repo)
        state = workdir / "state"
        process, ports, elapsed = start_serve(repo, workdir, "--local-nodes", "1", "--set",
                                              f"node.state_dir={state}")
        try:
            node = json.loads((state / "node0.ports.json").read_text())
            targets = {"direct": f"127.0.0.1:{node['grpc']}", "frontend": f"127.0.0.1:{ports['grpc']}"}
            results = {"cpus": os.cpu_count(), "models": []}
            for name in ("half_plus_two", "slow_5ms"):
                pids = {"frontend": process.pid, "node": node["pid"]}
                results["models"].append(bench_model(name, targets, args.requests, args.seconds, pids))
                print(json.dumps(results["models"][-1], indent=1), file=sys.stderr)
            results["frontend_rss_mb_embedded"] = round(psutil.Process(process.pid).memory_info().rss / 2**20, 1)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        results["startup"] = bench_startup(workdir, args.models)
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
