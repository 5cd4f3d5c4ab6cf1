#!/usr/bin/env python
"""Benchmark ``tfscache node``: Predict latency/throughput and model load/unload cost.

    .venv/bin/python scripts/bench_node.py [--seconds 5] [--repeats 3] [--sizes-mb 1,10,100]

1. Predict on half_plus_two over gRPC at concurrency 1 and 8 (one channel per worker
   thread, requests back to back for --seconds): p50, p99, requests/s.
2. For synthetic addk models of each size: load via HandleReloadConfigRequest (the RPC
   returns once the model is AVAILABLE), then unload via a reload without it, waiting
   for END in GetModelStatus; time of both, the node's own load/unload time from its
   log, and the node's RSS (psutil) before, after the load and after the unload.
   Medians over --repeats rounds.

Prints a Markdown table (docs/BENCHMARKS.md holds a run) and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def start_node(workdir: Path, config: Path) -> tuple[subprocess.Popen, dict, Path]:
    ports, log = workdir / "ports.json", workdir / "node.log"
    command = [sys.executable, "-m", "tfscache", "node", "--port=0", "--bind_address=127.0.0.1",
               f"--ports_file={ports}", f"--model_config_file={config}",
               "--file_system_poll_wait_seconds=0.05"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    while not ports.exists():
        if process.poll() is not None:
            raise SystemExit(f"node exited: {log.read_text()[-3000:]}")
        time.sleep(0.05)
    return process, json.loads(ports.read_text()), log


def config_text(models: dict[str, Path]) -> str:
    entries = "".join(f'config {{ name: "{n}" base_path: "{p}" model_platform: "tensorflow" }} '
                      for n, p in models.items())
    return f"model_config_list {{ {entries}}}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_predict(target: str, concurrency: int, seconds: float) -> dict:
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.inputs["x"].dtype = 1
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add(size=1)
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    start = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            stub.Predict(request, timeout=30)  # connect and warm up
            start.wait()
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                response = stub.Predict(request, timeout=30)
                latencies[i].append(time.perf_counter() - t0)
                assert response.outputs["y"].float_val[0] == 3.0

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + 3600  # set for real once every worker is connected
    start.wait()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    flat = [x for chunk in latencies for x in chunk]
    return {"concurrency": concurrency, "requests": len(flat), "p50_ms": 1e3 * percentile(flat, 0.5),
            "p99_ms": 1e3 * percentile(flat, 0.99), "rps": len(flat) / elapsed}


def bench_load_unload(target: str, pid: int, log: Path, base: dict[str, Path],
                      models: dict[str, Path], repeats: int) -> list[dict]:
    import grpc
    import psutil
    from google.protobuf import text_format
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_management_pb2,
        model_service_pb2_grpc,
    )

    node = psutil.Process(pid)
    results = []
    with grpc.insecure_channel(target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)

        def reload(config: dict[str, Path]) -> None:
            request = model_management_pb2.ReloadConfigRequest()
            text_format.Parse(config_text(config), request.config)
            stub.HandleReloadConfigRequest(request, timeout=300)

        def state(name: str) -> int:
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = name
            return stub.GetModelStatus(request, timeout=30).model_version_status[-1].state

        for name, path in models.items():
            rounds = []
            for _ in range(repeats):
                rss0 = node.memory_info().rss
                t0 = time.perf_counter()
                reload({**base, name: path})
                load_s = time.perf_counter() - t0
                rss1 = node.memory_info().rss
                t0 = time.perf_counter()
                reload(base)
                while state(name) != get_model_status_pb2.ModelVersionStatus.END:
                    time.sleep(0.002)
                unload_s = time.perf_counter() - t0
                rss2 = node.memory_info().rss
                rounds.append((load_s, unload_s, rss1 - rss0, rss2 - rss0))
            text = log.read_text()
            node_load = [float(x) for x in re.findall(rf"INFO tfscache.node.manager: loaded {name} version 1 in ([\d.]+) s", text)]
            node_unload = [float(x) for x in re.findall(rf"INFO tfscache.node.manager: unloaded {name} version 1 in ([\d.]+) s", text)]
            results.append({
                "model": name,
                "disk_bytes": sum(p.stat().st_size for p in path.rglob("*") if p.is_file()),
                "reload_rpc_load_s": statistics.median(r[0] for r in rounds),
                "node_load_s": statistics.median(node_load),
                "unload_until_end_s": statistics.median(r[1] for r in rounds),
                "node_unload_s": statistics.median(node_unload),
                "rss_after_load_delta": statistics.median(r[2] for r in rounds),
                "rss_after_unload_delta": statistics.median(r[3] for r in rounds),
                "rounds": rounds,
            })
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each Predict run")
    parser.add_argument("--repeats", type=int, default=3, help="load/unload rounds per size")
    parser.add_argument("--sizes-mb", default="1,10,100", help="synthetic model sizes in MB")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from support.models import tfserving as testmodels

    with tempfile.TemporaryDirectory(prefix="bench-node-") as tmp:
        tmp = Path(tmp)
        two = testmodels.build_test_models(tmp / "models")["half_plus_two"]
        sizes = [float(s) for s in args.sizes_mb.split(",")]
        synthetic = {}
        for k, mb in enumerate(sizes, start=1):
            path = testmodels.build_addk(tmp / f"synthetic-{k}", k, int(mb * 1_000_000))
            synthetic[f"addk_{k}"] = path
        base = {"half_plus_two": two}
        config = tmp / "models.config"
        config.write_text(config_text(base))
        process, ports, log = start_node(tmp, config)
        try:
            target = f"127.0.0.1:{ports['grpc']}"
            predict = [bench_predict(target, c, args.seconds) for c in (1, 8)]
            loads = bench_load_unload(target, ports["pid"], log, base, synthetic, args.repeats)
        finally:
            process.terminate()
            process.wait(30)
    results = {"machine": f"{os.cpu_count()} CPUs, {sys.platform}", "predict": predict,
               "load_unload": loads, "sizes_mb": sizes}
    print("| concurrency | requests | p50 ms | p99 ms | requests/s |\n|---|---|---|---|---|")
    for row in predict:
        print(f"| {row['concurrency']} | {row['requests']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
              f"| {row['rps']:.0f} |")
    print("\n| model | size MB | reload RPC s | node load s | unload until END s | node unload s "
          "| RSS after load MB | RSS after unload MB |\n|---|---|---|---|---|---|---|---|")
    for row, mb in zip(loads, sizes):
        print(f"| {row['model']} | {mb:g} | {row['reload_rpc_load_s']:.3f} | {row['node_load_s']:.3f} "
              f"| {row['unload_until_end_s']:.3f} | {row['node_unload_s']:.3f} "
              f"| {row['rss_after_load_delta'] / 1e6:+.1f} | {row['rss_after_unload_delta'] / 1e6:+.1f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
