#!/usr/bin/env python
"""Benchmark: copies that follow load, live, against fixed single replicas in the same run.

    .venv/bin/python scripts/bench_copies.py [--seconds 20] [--warmup 8] [--concurrency 24]
        [--sleep-ms 10] [--tail 12] [--json F]

1. Builds a Triton repository of python-backend models (tests/support/models/triton.py, no
   tensorflow): ``hot`` and ``tail_1`` .. ``tail_N``, each sleeping --sleep-ms per request.
   A Python-backend model has one instance per node, so each request holds that model's one
   slot on its node for --sleep-ms: node time matters, and the CPU (a shared 2-core VM) does
   not bound it.
2. For each configuration, starts ``tfscache serve --backend triton --local-nodes 4``
   (ports 0, a metrics port) and runs --concurrency closed-loop clients: each request is for
   ``hot`` with probability 1/2, else a tail model drawn by Zipf(1.0). After --warmup
   seconds (loads, copies spreading), it measures for --seconds: throughput (all, and the hot
   model's), latency p50/p99 (all, and the hot model's), and per-node requests (from the
   front end's ``tfscache_cache_hits_total`` + ``tfscache_cache_misses_total`` by node).
   Every answer is checked (y = x); a failed request ends the run.
   Configurations, in one run: ``fixed`` (``--no-copies``: one copy per model), ``copies=2``
   (``copies.max_copies = 2``) and ``copies`` (the defaults, up to 4 copies).

Only this client side imports tritonclient; the serve process never does. Prints Markdown
(docs/BENCHMARKS.md holds a run); --json F writes the figures. Every process it started is
stopped on exit (SIGTERM to serve, which stops its tritonservers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.models import triton as tritonmodels  # noqa: E402
from benchlib.report import machine  # noqa: E402  (scripts/ is the script's own directory)

PYTHON = sys.executable
INFER = "/inference.GRPCInferenceService/ModelInfer"
CONFIGS = {"fixed": ["--no-copies"], "copies=2": ["--set", "copies.max_copies=2"], "copies": []}
COUNTS = re.compile(r'^tfscache_cache_(?:hits|misses)_total\{node="([^"]+)"[^}]*\} ([0-9.e+]+)$', re.M)


def infer_bytes(name: str) -> bytes:
    """ModelInferRequest{model_name, inputs [x: FP32 [1]], raw_input_contents [2.0]}."""
    x = tgrpc.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    request = service_pb2.ModelInferRequest(model_name=name, inputs=[x._get_tensor()])
    request.raw_input_contents.append(x._get_content())
    return request.SerializeToString()


def check(name: str, answer: bytes) -> None:
    response = service_pb2.ModelInferResponse.FromString(answer)
    if np.frombuffer(response.raw_output_contents[0], dtype=np.float32).tolist() != [2.0]:
        raise SystemExit(f"wrong answer from {name}: {response}")


def start_serve(repo: Path, workdir: Path, extra: list[str]) -> tuple[subprocess.Popen, dict]:
    ports_file, log_path = workdir / "ports.json", workdir / "serve.log"
    log = open(log_path, "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "serve", "--backend", "triton",
                                "--model-repository", str(repo), "--local-nodes", "4",
                                "--grpc-port", "0", "--rest-port", "0", "--metrics-port", "0",
                                "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                                "--set", f"node.state_dir={workdir / 'state'}", *extra],
                               cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"serve did not start (exit {process.returncode}); see {log_path}:\n"
                             + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.05)
    return process, json.loads(ports_file.read_text())


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def node_counts(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts: dict[str, float] = {}
    for node, value in COUNTS.findall(text):
        counts[node] = counts.get(node, 0.0) + float(value)
    return counts


def copies_of(metrics_port: int, model: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=10) as reply:
        doc = json.loads(reply.read())
    return doc.get("copies", {}).get("models", {}).get(model, [])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


async def drive(target: str, names: list[str], weights: list[float], concurrency: int, warmup: float,
                seconds: float, seed: int, metrics_port: int) -> dict:
    requests = {name: infer_bytes(name) for name in names}
    rng = random.Random(seed)
    lat: dict[str, list[float]] = {"all": [], "hot": []}
    state = {"measuring": False}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = channel.unary_unary(INFER)
        for name in names:  # every model loaded once before the clock starts
            check(name, await stub(requests[name], timeout=120))

        async def worker(stop_at: float) -> None:
            while time.monotonic() < stop_at:
                name = rng.choices(names, weights)[0]
                began = time.perf_counter()
                check(name, await stub(requests[name], timeout=120))
                if state["measuring"]:
                    took = time.perf_counter() - began
                    lat["all"].append(took)
                    if name == "hot":
                        lat["hot"].append(took)

        end_warmup = time.monotonic() + warmup
        workers = [asyncio.ensure_future(worker(end_warmup + seconds)) for _ in range(concurrency)]
        await asyncio.sleep(max(0.0, end_warmup - time.monotonic()))
        before = await asyncio.to_thread(node_counts, metrics_port)
        state["measuring"] = True
        started = time.monotonic()
        await asyncio.gather(*workers)
        elapsed = time.monotonic() - started
        after = await asyncio.to_thread(node_counts, metrics_port)
    copies = await asyncio.to_thread(copies_of, metrics_port, "hot")
    return {"throughput": len(lat["all"]) / elapsed, "hot_throughput": len(lat["hot"]) / elapsed,
            "p50_ms": 1000 * pct(lat["all"], 50), "p99_ms": 1000 * pct(lat["all"], 99),
            "hot_p50_ms": 1000 * pct(lat["hot"], 50), "hot_p99_ms": 1000 * pct(lat["hot"], 99),
            "per_node": {n: int(after.get(n, 0) - before.get(n, 0)) for n in sorted(after)},
            "hot_copies": copies or ["(one: its home node)"], "requests": len(lat["all"])}


def markdown(figures: dict) -> str:
    lines = [f"Machine: {figures['machine']}", "",
             f"4 Triton nodes, {figures['concurrency']} closed-loop clients, `hot` half the requests and "
             f"{figures['tail']} tail models by Zipf(1.0), every model sleeping {figures['sleep_ms']} ms per "
             f"request; {figures['seconds']:g} s measured after {figures['warmup']:g} s of warm-up.", "",
             "| configuration | req/s | hot req/s | p50 ms | p99 ms | hot p50 ms | hot p99 ms | requests per node | "
             "hot model's copies |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, r in figures["results"].items():
        nodes = ", ".join(f"{n} {c}" for n, c in r["per_node"].items())
        lines.append(f"| {name} | {r['throughput']:.0f} | {r['hot_throughput']:.0f} | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['hot_p50_ms']:.1f} | {r['hot_p99_ms']:.1f} | {nodes} | "
                     f"{', '.join(r['hot_copies'])} |")
    fixed, two = figures["results"].get("fixed"), figures["results"].get("copies=2")
    if fixed and two and fixed["hot_throughput"]:
        lines += ["", f"Hot model throughput, two copies over one: "
                      f"{two['hot_throughput'] / fixed['hot_throughput']:.2f}x; hot p99 "
                      f"{fixed['hot_p99_ms']:.1f} ms -> {two['hot_p99_ms']:.1f} ms."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--sleep-ms", type=int, default=10)
    parser.add_argument("--tail", type=int, default=12)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = {"machine": machine(), "concurrency": args.concurrency, "tail": args.tail, "sleep_ms": args.sleep_ms,
               "seconds": args.seconds, "warmup": args.warmup, "results": {}}
    with tempfile.TemporaryDirectory(prefix="bench-copies-") as tmp:
        repo = Path(tmp) / "models"
        repo.mkdir()
        names = ["hot", *(f"tail_{i}" for i in range(1, args.tail + 1))]
        for name in names:
            tritonmodels.build_sleep(repo, args.sleep_ms, name=name)
        zipf = [1.0 / r for r in range(1, args.tail + 1)]
        weights = [sum(zipf), *zipf]  # hot: half of all requests
        for config in args.configs.split(","):
            workdir = Path(tmp) / config.replace("=", "")
            workdir.mkdir()
            process, ports = start_serve(repo, workdir, CONFIGS[config])
            try:
                print(f"{config}: serving on {ports['grpc']}", file=sys.stderr)
                figures["results"][config] = asyncio.run(drive(
                    f"127.0.0.1:{ports['grpc']}", names, weights, args.concurrency, args.warmup, args.seconds,
                    seed=1, metrics_port=ports["metrics"]))
                print(json.dumps(figures["results"][config]), file=sys.stderr)
            finally:
                stop(process)
    print(markdown(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
