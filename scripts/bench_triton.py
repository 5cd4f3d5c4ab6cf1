#!/usr/bin/env python
"""Benchmark: Triton through `tfscache serve --backend triton` versus straight to the node, same run.

    .venv/bin/python scripts/bench_triton.py [--requests 1000] [--seconds 10] [--rounds 11]
        [--client-processes 4] [--quick] [--json F]

1. Builds a Triton repository of python-backend models (tfscache/kinds/triton/testmodels.py, no
   tensorflow): addk_1 .. addk_N (y = x + k, tiny) and ``sleep_ms`` sleeping --sleep-ms
   (5) ms per request, the counterparts of half_plus_two and slow_5ms in
   scripts/bench_frontend.py.
2. Starts ``tfscache serve --backend triton --local-nodes 1`` (ports 0, --ports-file, an
   admin port) and reads its node's ports from the serve log ("node0 serving: pid P, gRPC
   G, REST R"), so "direct" and "through tfscache" hit the same tritonserver process.
3. Warm ModelInfer, per model (addk_1, sleep_ms): warm-up, then at concurrency 1 blocks
   of requests alternate direct / through tfscache (p50 and p99 of each, and the
   difference); at concurrency 16 each path runs for --seconds from --client-processes
   client processes (throughput and the ratio). A third path, the naive grpc.aio byte hop
   of scripts/bench_frontend.py in its own process in front of the same node, is the floor
   a Python gRPC proxy reaches, measured in the same run.
   The requests are tritonclient.grpc's ``ModelInferRequest`` (x = [2.0], FP32) serialized
   once and sent over raw gRPC channels, so the client's own cost is as small as Python
   allows; every answer is checked (y = x + k). Then, at concurrency 1 on addk_1 only,
   the same comparison with ``tritonclient.grpc.InferenceServerClient.infer`` and
   ``tritonclient.http.InferenceServerClient.infer`` (REST), what a user's client costs.
4. Cold load, --rounds rounds over models not loaded yet, in alternating order: a first
   ModelInfer through tfscache (the cache loads the model: RepositoryModelLoad, confirmed
   in the repository index) versus RepositoryModelLoad + ModelInfer straight to the node
   (the baseline), with tritonclient.grpc; between the two the model is unloaded (tfscache
   evict on the admin port; RepositoryModelUnload directly) and the index polled until it
   is UNAVAILABLE. Medians of both and of the per-round differences.

Only this client side imports tritonclient; the serve process never does. Prints
Markdown (docs/BENCHMARKS.md holds a run); --json F writes the figures. Every process
it started is stopped on exit (SIGTERM to serve, which stops its tritonserver).
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
import psutil
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_frontend import start_hop, throughput  # noqa: E402  (scripts/ is the script's own directory)
from tfscache.kinds.triton import testmodels as tritonmodels  # noqa: E402
from tfscache.admin.client import AdminClient  # noqa: E402

PYTHON = sys.executable
INFER = "/inference.GRPCInferenceService/ModelInfer"
NODE_LINE = re.compile(r"node0 serving: pid (\d+), gRPC (\d+), REST (\d+)")


def infer_bytes(name: str) -> bytes:
    """ModelInferRequest{model_name, inputs [x: FP32 [1]], raw_input_contents [2.0]}, as
    tritonclient.grpc's InferenceServerClient.infer builds it."""
    x = tgrpc.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    request = service_pb2.ModelInferRequest(model_name=name, inputs=[x._get_tensor()])
    request.raw_input_contents.append(x._get_content())
    return request.SerializeToString()


def expected_y(name: str) -> float:
    return 2.0 + (float(name.split("_")[1]) if name.startswith("addk_") else 0.0)


def check_answer(name: str, answer: bytes) -> bytes:
    """The answer parsed and checked once (y = x + k); later answers are compared to its bytes."""
    response = service_pb2.ModelInferResponse.FromString(answer)
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    if response.outputs[0].name != "y" or y.tolist() != [expected_y(name)]:
        raise SystemExit(f"wrong answer from {name}: {response}")
    return answer


def start_serve(repo: Path, workdir: Path) -> tuple[subprocess.Popen, dict, dict]:
    """tfscache serve --backend triton --local-nodes 1; its ports and its node's (from the log)."""
    ports_file, log_path = workdir / "ports.json", workdir / "serve.log"
    log = open(log_path, "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "serve", "--backend", "triton",
                                "--model-repository", str(repo), "--local-nodes", "1",
                                "--grpc-port", "0", "--rest-port", "0", "--admin-port", "0",
                                "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                                "--set", f"node.state_dir={workdir / 'state'}"],
                               cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"serve did not start (exit {process.returncode}); see {log_path}:\n"
                             + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.02)
    node = NODE_LINE.search(log_path.read_text(errors="replace"))
    if node is None:
        stop(process)
        raise SystemExit(f"no 'node0 serving' line in {log_path}")
    pid, grpc_port, rest_port = map(int, node.groups())
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


def alternate(calls: dict, n: int, block: int = 50) -> dict[str, list[float]]:
    """Blocks of ``block`` calls, path after path, so drift hits both alike; seconds per call."""
    samples = {label: [] for label in calls}
    for _ in range(max(1, n // block)):
        for label, call in calls.items():
            for _ in range(block):
                t = time.perf_counter()
                call()
                samples[label].append(time.perf_counter() - t)
    return samples


def raw_calls(name: str, targets: dict[str, str]) -> tuple[dict, list]:
    request = infer_bytes(name)
    calls, channels = {}, []
    for label, target in sorted(targets.items(), key=lambda item: item[0] != "tfscache"):  # it loads first
        channel = grpc.insecure_channel(target)
        channels.append(channel)
        stub = channel.unary_unary(INFER)
        good = check_answer(name, stub(request, timeout=120))

        def call(stub=stub, good=good):
            if stub(request, timeout=60) != good:
                raise SystemExit(f"wrong answer from {name}")

        for _ in range(50):  # warm: connections, caches
            call()
        calls[label] = call
    return calls, channels


def client_calls(name: str, grpc_targets: dict[str, str], http_targets: dict[str, str]) -> tuple[dict, list]:
    """tritonclient's own InferenceServerClient.infer, gRPC and REST."""
    x = np.array([2.0], dtype=np.float32)
    calls, clients = {}, []
    for label in grpc_targets:
        for proto, module, target in (("grpc", tgrpc, grpc_targets[label]), ("rest", thttp, http_targets[label])):
            client = module.InferenceServerClient(target)
            clients.append(client)
            inputs = [module.InferInput("x", [1], "FP32")]
            inputs[0].set_data_from_numpy(x)

            def call(client=client, inputs=inputs):
                if client.infer(name, inputs).as_numpy("y").tolist() != [expected_y(name)]:
                    raise SystemExit(f"wrong answer from {name}")

            for _ in range(20):
                call()
            calls[f"{proto} {label}"] = call
    return calls, clients


def _cpu(who: str, pid: int) -> float:
    """CPU seconds of serve itself, or of the node with its children (the python stubs); serve's
    children are the node, so they are not counted in its own."""
    try:
        process = psutil.Process(pid)
        total = 0.0
        for p in [process, *(process.children(recursive=True) if who == "node" else ())]:
            times = p.cpu_times()
            total += times.user + times.system
        return total
    except psutil.NoSuchProcess:
        return 0.0


def bench_warm(name: str, targets: dict[str, str], n: int, seconds: float, pids: dict[str, int],
               processes: int) -> dict:
    """c=1 latency over every path (alternating blocks); c=16 throughput from ``processes`` client
    processes, with each process tree's CPU per request."""
    calls, channels = raw_calls(name, targets)
    s = alternate(calls, n)
    for channel in channels:
        channel.close()
    result = {"model": name, "requests_c1": len(s["direct"])}
    for label in targets:
        result[f"{label}_p50_ms"] = pct(s[label], 50) * 1e3
        result[f"{label}_p99_ms"] = pct(s[label], 99) * 1e3
    result["added_p50_ms"] = result["tfscache_p50_ms"] - result["direct_p50_ms"]
    result["added_p99_ms"] = result["tfscache_p99_ms"] - result["direct_p99_ms"]
    for label, target in targets.items():
        rps, cpu = throughput(target, infer_bytes(name), 16, seconds, processes, method=INFER, pids=pids, cpu=_cpu)
        result[f"{label}_rps_c16"] = rps
        for who in pids:  # CPU time per request of each process (tree) on this path
            result[f"{label}_c16_{who}_cpu_us_per_request"] = cpu[who] / (rps * seconds) * 1e6
    result["throughput_ratio_c16"] = result["tfscache_rps_c16"] / result["direct_rps_c16"]
    return result


def bench_clients(name: str, grpc_targets: dict[str, str], http_targets: dict[str, str], n: int) -> dict:
    calls, clients = client_calls(name, grpc_targets, http_targets)
    s = alternate(calls, n)
    for client in clients:
        client.close()
    result = {"model": name, "requests_c1": len(s["grpc direct"])}
    for proto in ("grpc", "rest"):
        for label in grpc_targets:
            result[f"{proto}_{label}_p50_ms"] = pct(s[f"{proto} {label}"], 50) * 1e3
            result[f"{proto}_{label}_p99_ms"] = pct(s[f"{proto} {label}"], 99) * 1e3
        result[f"{proto}_added_p50_ms"] = result[f"{proto}_tfscache_p50_ms"] - result[f"{proto}_direct_p50_ms"]
        result[f"{proto}_added_p99_ms"] = result[f"{proto}_tfscache_p99_ms"] - result[f"{proto}_direct_p99_ms"]
    return result


def until_unavailable(node: tgrpc.InferenceServerClient, name: str, timeout: float = 60.0) -> None:
    """Poll the node's repository index until ``name`` is not READY/LOADING/UNLOADING."""
    deadline = time.monotonic() + timeout
    while True:
        states = {m.state for m in node.get_model_repository_index(as_json=False).models if m.name == name}
        if not states & {"READY", "LOADING", "UNLOADING"}:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} still {states} on the node after {timeout} s")
        time.sleep(0.01)


def bench_cold(names: list[str], frontend: str, node_target: str, admin: AdminClient, serve_log: Path) -> dict:
    x = tgrpc.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    via = tgrpc.InferenceServerClient(frontend)
    node = tgrpc.InferenceServerClient(node_target)

    def infer(client, name):
        if client.infer(name, [x], client_timeout=120).as_numpy("y").tolist() != [expected_y(name)]:
            raise SystemExit(f"wrong answer from {name}")

    parts = {"direct_load": [], "direct_first_infer": [], "tfscache_logged_load": []}

    def direct(name):
        t = time.perf_counter()
        node.load_model(name)
        loaded = time.perf_counter()
        infer(node, name)
        elapsed = time.perf_counter() - t
        parts["direct_load"].append(loaded - t)
        parts["direct_first_infer"].append(elapsed - (loaded - t))
        node.unload_model(name)
        until_unavailable(node, name)
        return elapsed

    def through(name):
        t = time.perf_counter()
        infer(via, name)
        elapsed = time.perf_counter() - t
        logged = re.findall(rf"node node0: loaded {name} version 1 in ([0-9.]+) s", serve_log.read_text())
        parts["tfscache_logged_load"].append(float(logged[-1]) if logged else float("nan"))
        admin.evict(name)  # returns once the cache saw it unloaded
        until_unavailable(node, name)
        return elapsed

    # Warm-up, once per path: the python backend's first stub start, page cache, connections.
    direct(names[0])
    through(names[0])
    for values in parts.values():
        values.clear()
    times = {"direct": [], "tfscache": []}
    diffs = []
    for i, name in enumerate(names[1:]):
        round_times = {}
        for method in (("direct", "tfscache") if i % 2 == 0 else ("tfscache", "direct")):
            round_times[method] = (direct if method == "direct" else through)(name)
        for method, elapsed in round_times.items():
            times[method].append(elapsed)
        diffs.append(round_times["tfscache"] - round_times["direct"])
    via.close()
    node.close()
    return {"rounds": len(diffs), "direct_ms": 1e3 * statistics.median(times["direct"]),
            "tfscache_ms": 1e3 * statistics.median(times["tfscache"]),
            "added_median_ms": 1e3 * statistics.median(diffs),
            "added_p90_ms": 1e3 * sorted(diffs)[int(0.9 * (len(diffs) - 1))],
            # the parts: the node's load RPC and first infer (direct), and the load as the cache
            # logs it (RepositoryModelLoad + the index confirming READY); the rest of the time
            # through tfscache is routing, the lease, the memory reads and the forwarded infer.
            **{f"{key}_median_ms": 1e3 * statistics.median(values) for key, values in parts.items()},
            "tfscache_outside_load_median_ms": 1e3 * statistics.median(
                total - load for total, load in zip(times["tfscache"], parts["tfscache_logged_load"])),
            "direct_all_ms": [round(1e3 * t, 1) for t in times["direct"]],
            "tfscache_all_ms": [round(1e3 * t, 1) for t in times["tfscache"]]}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f} at start")


def markdown(figures: dict) -> str:
    lines = [f"Machine: {figures['machine']}"]
    if figures.get("warm"):
        lines += ["", "Warm ModelInfer, pre-serialized requests over raw gRPC channels:", "",
             "| model | path | p50 ms (c=1) | p99 ms (c=1) | req/s (c=16) | proxy CPU µs/req (c=16) "
             "| node CPU µs/req (c=16) |", "|---|---|---|---|---|---|---|"]
    for r in figures.get("warm", []):
        for label, shown in (("direct", "direct"), ("naive hop", "naive grpc.aio hop"),
                             ("tfscache", "through tfscache")):
            if f"{label}_p50_ms" not in r:
                continue
            front = "–" if label == "direct" else f"{r[f'{label}_c16_{label}_cpu_us_per_request']:.0f}"
            lines.append(f"| {r['model']} | {shown} | {r[f'{label}_p50_ms']:.2f} | {r[f'{label}_p99_ms']:.2f} "
                         f"| {r[f'{label}_rps_c16']:.0f} | {front} | {r[f'{label}_c16_node_cpu_us_per_request']:.0f} |")
    if figures.get("warm"):
        lines += ["", "| model | added p50 (c=1) | added p99 (c=1) | throughput ratio (c=16) |",
                  "|---|---|---|---|"]
    for r in figures.get("warm", []):
        lines.append(f"| {r['model']} | {r['added_p50_ms']:+.2f} ms | {r['added_p99_ms']:+.2f} ms "
                     f"| {r['throughput_ratio_c16']:.2f} |")
    if figures.get("clients"):
        c = figures["clients"]
        lines += ["", f"tritonclient's InferenceServerClient.infer on {c['model']}, c=1, {c['requests_c1']} "
                  "requests per path:", "",
                  "| client | direct p50 / p99 ms | through tfscache p50 / p99 ms | added p50 | added p99 |",
                  "|---|---|---|---|---|"]
        for proto, shown in (("grpc", "tritonclient.grpc"), ("rest", "tritonclient.http (REST)")):
            lines.append(f"| {shown} | {c[f'{proto}_direct_p50_ms']:.2f} / {c[f'{proto}_direct_p99_ms']:.2f} "
                         f"| {c[f'{proto}_tfscache_p50_ms']:.2f} / {c[f'{proto}_tfscache_p99_ms']:.2f} "
                         f"| {c[f'{proto}_added_p50_ms']:+.2f} ms | {c[f'{proto}_added_p99_ms']:+.2f} ms |")
    cold = figures.get("cold")
    if not cold:
        return "\n".join(lines)
    lines += ["", "Cold load (first ModelInfer of a model not loaded):", "",
              "| rounds | direct RepositoryModelLoad + ModelInfer, median | ModelInfer through tfscache, median "
              "| added: median of per-round differences | p90 |", "|---|---|---|---|---|",
              f"| {cold['rounds']} | {cold['direct_ms']:.1f} ms | {cold['tfscache_ms']:.1f} ms "
              f"| {cold['added_median_ms']:+.1f} ms | {cold['added_p90_ms']:+.1f} ms |", "",
              "| part, median | ms |", "|---|---|",
              f"| direct: RepositoryModelLoad | {cold['direct_load_median_ms']:.1f} |",
              f"| direct: the first ModelInfer after it | {cold['direct_first_infer_median_ms']:.1f} |",
              f"| through tfscache: the load as serve logs it (RepositoryModelLoad + index) "
              f"| {cold['tfscache_logged_load_median_ms']:.1f} |",
              f"| through tfscache: the rest (routing, lease, memory reads, the forwarded first infer) "
              f"| {cold['tfscache_outside_load_median_ms']:.1f} |"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per path at concurrency 1")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per path at concurrency 16")
    parser.add_argument("--rounds", type=int, default=11, help="cold-load rounds (after one warm-up)")
    parser.add_argument("--sleep-ms", type=int, default=5, help="the sleep model's time per request")
    parser.add_argument("--skip", choices=("warm", "clients", "cold"), action="append", default=[],
                        help="leave a part out (repeatable)")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="client processes for the c=16 throughput (not threads)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 300 requests at c=1, 3 s per path, warm part only")
    parser.add_argument("--json", help="write the figures as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seconds = min(args.requests, 300), min(args.seconds, 3.0)
        args.skip = sorted({*args.skip, "clients", "cold"})
    figures = {"machine": machine(), "command": " ".join(sys.argv)}
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        tritonmodels.build_triton_models(repo, synthetic=args.rounds + 2, sleep_ms=args.sleep_ms)
        process, ports, node = start_serve(repo, workdir)
        hop = None
        try:
            grpc_targets = {"direct": f"127.0.0.1:{node['grpc']}", "tfscache": f"127.0.0.1:{ports['grpc']}"}
            http_targets = {"direct": f"127.0.0.1:{node['rest']}", "tfscache": f"127.0.0.1:{ports['rest']}"}
            pids = {"tfscache": process.pid, "node": node["pid"]}
            figures["warm"] = []
            if "warm" not in args.skip:
                hop, hop_ports = start_hop(grpc_targets["direct"], workdir)  # the floor, in its own process
                warm_targets = {**grpc_targets, "naive hop": f"127.0.0.1:{hop_ports['grpc']}"}
                for name in ("addk_1", "sleep_ms"):
                    figures["warm"].append(bench_warm(name, warm_targets, args.requests, args.seconds,
                                                      {**pids, "naive hop": hop.pid}, args.client_processes))
                    print(json.dumps(figures["warm"][-1], indent=1), file=sys.stderr)
            if "clients" not in args.skip:
                figures["clients"] = bench_clients("addk_1", grpc_targets, http_targets, args.requests // 2)
                print(json.dumps(figures["clients"], indent=1), file=sys.stderr)
            if "cold" not in args.skip:
                with AdminClient(f"127.0.0.1:{ports['admin']}") as admin:
                    names = [f"addk_{k}" for k in range(2, args.rounds + 3)]
                    figures["cold"] = bench_cold(names, grpc_targets["tfscache"], grpc_targets["direct"], admin,
                                                 workdir / "serve.log")
                print(json.dumps(figures["cold"], indent=1), file=sys.stderr)
            figures["tfscache_rss_mb"] = round(psutil.Process(process.pid).memory_info().rss / 2**20, 1)
        finally:
            if hop is not None:
                stop(hop)
            stop(process)
            try:  # serve stops its node; never leave one behind
                left = psutil.Process(node["pid"])
                if "tritonserver" in left.name():
                    left.kill()
            except psutil.NoSuchProcess:
                pass
    print(markdown(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
