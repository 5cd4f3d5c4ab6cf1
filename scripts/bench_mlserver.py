#!/usr/bin/env python
"""Benchmark: MLServer through `tfscache serve --backend mlserver` versus straight to the node, same run.

    .venv/bin/python scripts/bench_mlserver.py [--requests 600] [--seconds 10] [--rounds 7] [--json F]

1. Builds an MLServer repository (tests/support/models/mlserver.py, trained by
   .mlserver/bin/python): addk_1 .. addk_N, scikit-learn LinearRegression, predict = x + k.
2. Starts ``tfscache serve --backend mlserver --local-nodes 1 --node-command
   .mlserver/bin/mlserver`` and reads its node's ports from the serve log ("node0 serving: pid
   P, gRPC G, REST R"), so "direct" and "through tfscache" hit the same MLServer process.
3. Warm ModelInfer on addk_1: at concurrency 1, blocks of 50 requests alternate direct /
   through tfscache (p50 and p99 of each, and the difference); at concurrency 16 each path runs
   for --seconds (throughput and the ratio). Requests are tritonclient.grpc's ModelInferRequest
   (x = [[2.0]], FP32, raw contents) serialized once and sent over raw gRPC channels; every
   answer is checked (predict = 2 + k).
4. Cold load, --rounds rounds over models not loaded yet: a first ModelInfer through tfscache
   (the cache loads the model: RepositoryModelLoad, then ModelReady) versus RepositoryModelLoad +
   ModelInfer straight to the node (the baseline); the model is unloaded in between (tfscache
   evict on the admin port; RepositoryModelUnload directly). Medians of both and of the
   per-round differences.

Prints Markdown (docs/BENCHMARKS.md holds a run); --json F writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tfscache.admin.client import AdminClient  # noqa: E402
from support.models.mlserver import build_mlserver_models  # noqa: E402

MLSERVER = REPO / ".mlserver" / "bin" / "mlserver"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
UNLOAD = "/inference.GRPCInferenceService/RepositoryModelUnload"
NODE_LINE = re.compile(r"node0 serving: pid (\d+), gRPC (\d+), REST (\d+)")


def infer_bytes(name: str) -> bytes:
    x = tgrpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[2.0]], dtype=np.float32))
    request = service_pb2.ModelInferRequest(model_name=name, inputs=[x._get_tensor()])
    request.raw_input_contents.append(x._get_content())
    return request.SerializeToString()


def check(name: str, answer: bytes) -> None:
    response = service_pb2.ModelInferResponse.FromString(answer)
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float64).tolist()
    if response.outputs[0].name != "predict" or y != [2.0 + int(name.split("_")[1])]:
        raise SystemExit(f"wrong answer from {name}: {response}")


def start_serve(repo: Path, workdir: Path) -> tuple[subprocess.Popen, dict, dict]:
    ports_file, log_path = workdir / "ports.json", workdir / "serve.log"
    log = open(log_path, "ab")
    process = subprocess.Popen([sys.executable, "-m", "tfscache", "serve", "--backend", "mlserver",
                                "--node-command", str(MLSERVER), "--model-repository", str(repo),
                                "--local-nodes", "1", "--grpc-port", "0", "--rest-port", "0", "--admin-port", "0",
                                "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                                "--set", f"node.state_dir={workdir / 'state'}"],
                               cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"serve did not start; see {log_path}")
        time.sleep(0.05)
    pid, grpc_port, rest_port = map(int, NODE_LINE.search(log_path.read_text(errors="replace")).groups())
    return process, json.loads(ports_file.read_text()), {"pid": pid, "grpc": grpc_port, "rest": rest_port}


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def bench_warm(name: str, targets: dict[str, str], n: int, seconds: float) -> dict:
    request = infer_bytes(name)
    calls, channels = {}, []
    for label, target in sorted(targets.items(), key=lambda item: item[0] != "tfscache"):  # it loads first
        channel = grpc.insecure_channel(target)
        channels.append(channel)
        stub = channel.unary_unary(INFER)
        check(name, stub(request, timeout=120))
        for _ in range(30):
            stub(request, timeout=60)
        calls[label] = stub
    samples = {label: [] for label in calls}
    for _ in range(max(1, n // 50)):
        for label, stub in calls.items():
            for _ in range(50):
                t = time.perf_counter()
                check(name, stub(request, timeout=60))
                samples[label].append(time.perf_counter() - t)
    for channel in channels:
        channel.close()
    out = {label: {"p50_ms": pct(v, 50) * 1e3, "p99_ms": pct(v, 99) * 1e3} for label, v in samples.items()}
    out["added_p50_ms"] = out["tfscache"]["p50_ms"] - out["direct"]["p50_ms"]
    for label, target in targets.items():
        out[label]["rps_c16"] = asyncio.run(throughput(target, request, name, 16, seconds))
    out["ratio_c16"] = out["tfscache"]["rps_c16"] / out["direct"]["rps_c16"]
    return out


async def throughput(target: str, request: bytes, name: str, concurrency: int, seconds: float) -> float:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = channel.unary_unary(INFER)
        check(name, await stub(request, timeout=60))
        done, stop_at = 0, time.monotonic() + seconds

        async def worker():
            nonlocal done
            while time.monotonic() < stop_at:
                await stub(request, timeout=60)
                done += 1

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - start)


def bench_cold(names: list[str], frontend: str, node: str, admin: AdminClient) -> dict:
    through, direct = [], []
    front, back = grpc.insecure_channel(frontend), grpc.insecure_channel(node)
    infer_front, infer_back = front.unary_unary(INFER), back.unary_unary(INFER)
    load = back.unary_unary(LOAD, request_serializer=service_pb2.RepositoryModelLoadRequest.SerializeToString)
    unload = back.unary_unary(UNLOAD, request_serializer=service_pb2.RepositoryModelUnloadRequest.SerializeToString)
    for i, name in enumerate(names):
        request = infer_bytes(name)
        for path in (("tfscache", "direct") if i % 2 == 0 else ("direct", "tfscache")):
            t = time.perf_counter()
            if path == "tfscache":
                check(name, infer_front(request, timeout=300))
                through.append(time.perf_counter() - t)
                admin.evict(name)  # returns once the cache saw it unloaded
            else:
                load(service_pb2.RepositoryModelLoadRequest(model_name=name), timeout=300)
                check(name, infer_back(request, timeout=300))
                direct.append(time.perf_counter() - t)
                unload(service_pb2.RepositoryModelUnloadRequest(model_name=name), timeout=300)
    front.close()
    back.close()
    return {"through_ms": statistics.median(through) * 1e3, "direct_ms": statistics.median(direct) * 1e3,
            "overhead_ms": statistics.median(t - d for t, d in zip(through, direct)) * 1e3, "rounds": len(names)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mlserver-") as tmp:
        work = Path(tmp)
        build_mlserver_models(work / "repo", MLSERVER.parent / "python", synthetic=args.rounds + 1,
                              classifier=False, xgboost=False)
        process, ports, node = start_serve(work / "repo", work)
        try:
            targets = {"tfscache": f"127.0.0.1:{ports['grpc']}", "direct": f"127.0.0.1:{node['grpc']}"}
            warm = bench_warm("addk_1", targets, args.requests, args.seconds)
            with AdminClient(f"127.0.0.1:{ports['admin']}") as admin:
                cold = bench_cold([f"addk_{k}" for k in range(2, args.rounds + 2)], targets["tfscache"],
                                  targets["direct"], admin)
        finally:
            stop(process)
    figures = {"warm": warm, "cold": cold, "machine": f"{platform.node()} {os.cpu_count()} cpus"}
    w = warm
    print(f"| path | p50 ms | p99 ms | req/s at c=16 |\n|---|---|---|---|\n"
          f"| direct to MLServer | {w['direct']['p50_ms']:.2f} | {w['direct']['p99_ms']:.2f} | {w['direct']['rps_c16']:.0f} |\n"
          f"| through tfscache | {w['tfscache']['p50_ms']:.2f} | {w['tfscache']['p99_ms']:.2f} | "
          f"{w['tfscache']['rps_c16']:.0f} |\n\nwarm added p50 {w['added_p50_ms']:.2f} ms; throughput ratio at c=16 "
          f"{w['ratio_c16']:.2f}\n\ncold ({cold['rounds']} rounds, medians): through tfscache {cold['through_ms']:.0f} ms, "
          f"direct load + infer {cold['direct_ms']:.0f} ms, overhead {cold['overhead_ms']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
