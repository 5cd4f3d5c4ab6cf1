#!/usr/bin/env python
"""Benchmark: warm Predict through `tfscache serve` versus straight to the node and through a
naive grpc.aio byte hop, same run.

    .venv/bin/python scripts/bench_frontend.py [--requests 2000] [--seconds 10] [--concurrency 16,64]
        [--client-processes 4] [--workers 1,2,4] [--data-plane python,haproxy]
        [--baseline-tree DIR] [--quick] [--out results.json]

1. Builds half_plus_two and ``slow_5ms`` (a graph of chained 256x256 matmuls taking
   about 5 ms per call, calibrated here) into a temporary repository.
2. Starts one ``tfscache node`` and, in front of it: the naive hop (this script with
   ``--naive-hop``: a grpc.aio server forwarding each call's bytes on one channel, nothing
   else: the floor a Python gRPC proxy reaches), ``tfscache serve`` as a sidecar of that
   node, and optionally one more from ``--baseline-tree`` (another checkout: a before/after in
   the same run). Every path hits the same node process.
3. Per model, warm-up, then at concurrency 1 it alternates blocks of requests over every
   path and reports p50/p99 of each and what each adds over direct; at each concurrency it
   runs each path for ``--seconds`` from ``--client-processes`` client processes (not
   threads: one Python client process would be the bottleneck) and reports throughput, the
   ratio to direct, and CPU per request of the proxy (with its child processes) and the node.
   ``--workers 1,2,4``: one ``tfscache serve --workers N`` per N, all sidecars of the same
   node, every one measured in the same run; the front end's CPU is the serve process with
   all its children (the control process and its workers, read from /proc), and a table per
   model gives each N's ratio to direct at each concurrency, its p50/p99 at c=1, its CPU per
   request, and its throughput over that of 1 worker.
4. Front-end RSS and start-up time with 10,000 model directories in the repository
   (sidecar mode against a running node, so start-up is the front end's own).

Clients send pre-serialized request bytes over raw channels, so the client's own cost is
as small as Python allows; clients, proxies and node share this machine's cores. Prints
JSON, then Markdown tables. ``--quick``: half_plus_two only, short, no start-up test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]
PYTHON = sys.executable
PREDICT = "/tensorflow.serving.PredictionService/Predict"


def build_models(root: Path) -> None:
    """half_plus_two (TF Serving's) and slow_5ms, in a child process (it imports tensorflow)."""
    code = f"""
import time
from pathlib import Path
import numpy as np
import tensorflow as tf
from support.models import tfserving as testmodels
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
    # the test models live in tests/support/models (not in the wheel)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
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


def start_serve(repo: Path, workdir: Path, *args: str, tree: Path = REPO) -> tuple[subprocess.Popen, dict, float]:
    """`tfscache serve` from ``tree`` (default: this checkout), with its ports once it serves."""
    ports_file = workdir / f"ports-{time.monotonic_ns()}.json"
    started = time.monotonic()
    log = open(workdir / "serve.log", "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "serve", "--model-repository", str(repo),
                                "--grpc-port", "0", "--rest-port", "0", "--bind-address", "127.0.0.1",
                                "--ports-file", str(ports_file), "--log-level", "WARNING", *args],
                               cwd=tree, stdout=log, stderr=log,
                               env={**os.environ, "PYTHONPATH": str(tree)})
    while not ports_file.exists():
        if process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode}; see {workdir / 'serve.log'}")
        time.sleep(0.005)
    return process, json.loads(ports_file.read_text()), time.monotonic() - started


# -- the naive byte hop: the floor a Python gRPC front end can reach --------------------------

async def _naive_hop(target: str, ports_file: Path) -> None:
    """A grpc.aio server that sends each unary call's bytes on to ``target`` and its answer back:
    one channel, no metadata, no routing, no lease, no accounting."""
    channel = grpc.aio.insecure_channel(target)
    handlers: dict[str, grpc.RpcMethodHandler] = {}

    def handler(path: str) -> grpc.RpcMethodHandler:
        call = channel.unary_unary(path)

        async def forward(request: bytes, context) -> bytes:
            return await call(request, timeout=context.time_remaining())

        return grpc.unary_unary_rpc_method_handler(forward)

    class Generic(grpc.GenericRpcHandler):
        def service(self, details):
            found = handlers.get(details.method)
            if found is None:
                found = handlers[details.method] = handler(details.method)
            return found

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([Generic()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"grpc": port, "pid": os.getpid()}))
    tmp.rename(ports_file)
    await server.wait_for_termination()


def start_hop(target: str, workdir: Path) -> tuple[subprocess.Popen, dict]:
    """The naive hop in its own process (this script, ``--naive-hop TARGET``), in front of ``target``."""
    ports_file = workdir / f"hop-{time.monotonic_ns()}.json"
    process = subprocess.Popen([PYTHON, __file__, "--naive-hop", target, "--hop-ports-file", str(ports_file)],
                               cwd=REPO)
    while not ports_file.exists():
        if process.poll() is not None:
            raise SystemExit(f"the naive hop exited with {process.returncode}")
        time.sleep(0.005)
    return process, json.loads(ports_file.read_text())


# -- clients ------------------------------------------------------------------------------

def warm(targets: dict[str, str], names: list[str]) -> None:
    """Each front end loads each model (twice round: every sidecar's cache has synced with the node,
    and they all want the same models, so none unloads another's), before anything is timed."""
    for _ in range(2):
        for name in names:
            for label, target in targets.items():
                if label not in ("direct", "naive hop"):
                    with grpc.insecure_channel(target) as channel:
                        channel.unary_unary(PREDICT)(predict_bytes(name), timeout=120)


def latency_c1(targets: dict[str, str], request: bytes, n: int, block: int = 50,
               method: str = PREDICT) -> dict[str, list[float]]:
    calls = {}
    for label, target in targets.items():
        channel = grpc.insecure_channel(target)
        calls[label] = channel.unary_unary(method)
        for _ in range(50):  # warm: load, connections, caches
            calls[label](request, timeout=60)
    samples = {label: [] for label in targets}
    for _ in range(max(1, n // block)):  # alternate blocks so drift hits every path alike
        for label, call in calls.items():
            for _ in range(block):
                t = time.perf_counter()
                call(request, timeout=60)
                samples[label].append(time.perf_counter() - t)
    return samples


async def _client(target: str, request: bytes, concurrency: int, seconds: float, method: str, barrier) -> int:
    """``concurrency`` callers back to back on one channel for ``seconds``, once every client
    process is connected and warm (``barrier``, which the parent passes too)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for _ in range(10):
            await call(request, timeout=60)
        await asyncio.to_thread(barrier.wait, 300)
        done = 0
        stop = time.monotonic() + seconds

        async def caller():
            nonlocal done
            while time.monotonic() < stop:
                await call(request, timeout=60)
                done += 1

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return done


def _client_process(args: tuple, barrier, results) -> None:
    results.put(asyncio.run(_client(*args, barrier)))


def throughput(target: str, request: bytes, concurrency: int, seconds: float, processes: int,
               method: str = PREDICT, pids: dict[str, int] | None = None,
               cpu=None) -> tuple[float, dict[str, float]]:
    """Requests per second with ``concurrency`` calls in flight, spread over ``processes`` client
    processes (so the client is not one Python core); and each of ``pids``' CPU seconds over the
    timed window (``cpu(who, pid)``; default: the process and its children)."""
    cpu_of = cpu or (lambda who, pid: _cpu(pid))
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    clients = [context.Process(target=_client_process, args=((target, request, share, seconds, method),
                                                             barrier, results), daemon=True)
               for share in shares]
    for client in clients:
        client.start()
    try:
        barrier.wait(300)  # every client connected and warm: the clock starts
        before = {who: cpu_of(who, pid) for who, pid in (pids or {}).items()}
        time.sleep(seconds)
        used = {who: cpu_of(who, pid) - before[who] for who, pid in (pids or {}).items()}
        done = sum(results.get(timeout=120) for _ in clients)
    finally:
        for client in clients:
            client.join(30)
            if client.is_alive():
                client.kill()
    return done / seconds, used


def _cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children."""
    total = 0.0
    try:
        process = psutil.Process(pid)
        for p in [process, *process.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
    except psutil.NoSuchProcess:
        pass
    return total


def _rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its children (a serve's control process and workers)."""
    try:
        process = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0


def front_label(n: int, workers: list[int]) -> str:
    """The path's name for ``tfscache serve --workers n``: plain "tfscache" when it is the only one."""
    return "tfscache" if workers == [1] else f"tfscache w={n}"


def workers_table(model: dict, workers: list[int]) -> list[str]:
    """Each worker count's figures in one table (issue 22 item 6), ratios to direct and to 1 worker."""
    paths = model["paths"]
    cs = [int(k[5:]) for k in paths["direct"] if k.startswith("rps_c")]
    one = paths.get(front_label(1, workers))
    head = "| workers | p50 ms (c=1) | p99 ms (c=1) |" + "".join(
        f" ratio to direct c={c} | front-end CPU µs/req c={c} | vs 1 worker c={c} |" for c in cs)
    lines = [head, "|" + "---|" * (3 + 3 * len(cs))]
    for label, shown in [("naive hop", "naive hop"), *((front_label(n, workers), str(n)) for n in workers)]:
        p = paths[label]
        row = f"| {shown} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} |"
        for c in cs:
            versus = "–" if one is None or label == "naive hop" else f"{p[f'rps_c{c}'] / one[f'rps_c{c}']:.2f}"
            row += f" {p[f'ratio_c{c}']:.2f} | {p[f'proxy_cpu_us_c{c}']:.0f} | {versus} |"
        lines.append(row)
    return lines


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def bench_model(name: str, targets: dict[str, str], n: int, seconds: float, pids: dict[str, int],
                concurrencies: tuple[int, ...], processes: int) -> dict:
    """p50/p99 at c=1 on every path (alternating blocks), then throughput and each proxy's CPU per
    request at each concurrency; ratios to direct and to the naive hop."""
    request = predict_bytes(name)
    s = latency_c1(targets, request, n)
    result = {"model": name, "requests_c1": len(s["direct"]), "paths": {}}
    for label in targets:
        path = result["paths"][label] = {"p50_ms": pct(s[label], 50) * 1e3, "p99_ms": pct(s[label], 99) * 1e3,
                                         "mean_ms": statistics.fmean(s[label]) * 1e3}
        path["added_p50_ms"] = path["p50_ms"] - pct(s["direct"], 50) * 1e3
    for c in concurrencies:
        for label, target in targets.items():
            rps, cpu = throughput(target, request, c, seconds, processes,
                                  pids={k: v for k, v in pids.items() if k in (label, "node")})
            path = result["paths"][label]
            path[f"rps_c{c}"] = rps
            path[f"node_cpu_us_c{c}"] = cpu["node"] / (rps * seconds) * 1e6
            if label in pids:
                path[f"proxy_cpu_us_c{c}"] = cpu[label] / (rps * seconds) * 1e6
        for label in targets:
            result["paths"][label][f"ratio_c{c}"] = result["paths"][label][f"rps_c{c}"] / result["paths"]["direct"][
                f"rps_c{c}"]
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


_ACCOUNTING = """
import timeit
try:
    from tfscache.observe.metrics import Metrics
except ImportError:  # a checkout from before the layout of issue 19
    from tfscache.metrics import Metrics
metrics = Metrics(process=False)
events = metrics.cache_events("node0")

def one():
    started = metrics.begin()
    events.hit(("half_plus_two", 1))
    metrics.request("grpc", "Predict", "OK", started)

print(min(timeit.repeat(one, number=20000, repeat=7)) / 20000 * 1e6)
"""


def bench_accounting(tree: Path) -> float:
    """Microseconds of one warm request's accounting in ``tree``'s code (Metrics.begin, the cache
    hit's event, Metrics.request: counter, latency histogram), best of 7 repeats, in a child process."""
    out = subprocess.run([PYTHON, "-c", _ACCOUNTING], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def markdown(results: dict) -> str:
    """The results as docs/BENCHMARKS.md's tables."""
    lines = ["| code | one warm request's accounting, µs |", "|---|---|"]
    lines += [f"| {label} | {us:.2f} |" for label, us in results.get("accounting_us", {}).items()]
    lines.append("")
    for model in results["models"]:
        cs = [int(k[5:]) for k in model["paths"]["direct"] if k.startswith("rps_c")]
        head = "| path | p50 ms (c=1) | p99 ms (c=1) | added p50 vs direct |" + "".join(
            f" req/s c={c} | ratio to direct c={c} | proxy CPU µs/req c={c} |" for c in cs)
        lines += [f"### {model['model']}", "", head, "|" + "---|" * (4 + 3 * len(cs))]
        for label, p in model["paths"].items():
            row = f"| {label} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['added_p50_ms']:+.2f} |"
            for c in cs:
                cpu = p.get(f"proxy_cpu_us_c{c}")
                row += f" {p[f'rps_c{c}']:.0f} | {p[f'ratio_c{c}']:.2f} | {'–' if cpu is None else f'{cpu:.0f}'} |"
            lines.append(row)
        lines.append("")
        if results.get("workers", [1]) != [1]:
            lines += [f"{model['model']} by workers:", "", *workers_table(model, results["workers"]), ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per path at concurrency 1")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per path and concurrency")
    parser.add_argument("--concurrency", default="16", help="comma-separated concurrencies for throughput")
    parser.add_argument("--client-processes", type=int, default=4, help="client processes for throughput")
    parser.add_argument("--models", type=int, default=10_000, help="model directories for the start-up test")
    parser.add_argument("--baseline-tree", type=Path,
                        help="also run the front end from this checkout (e.g. the commit before a change): "
                             "a same-run before/after")
    parser.add_argument("--workers", default="1",
                        help="comma-separated worker counts (tfscache serve --workers N), each its own front end "
                             "in the same run, e.g. 1,2,4")
    parser.add_argument("--data-plane", default="python",
                        help="comma-separated data planes (python, haproxy): haproxy adds a path "
                             "'tfscache haproxy' (serve --data-plane haproxy; its CPU is the serve "
                             "process with its children, HAProxy included)")
    parser.add_argument("--only", help="comma-separated models (half_plus_two, slow_5ms); default both")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 400 requests at c=1, 3 s per path, half_plus_two, no start-up test")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--naive-hop", help=argparse.SUPPRESS)  # internal: serve the naive hop to this target
    parser.add_argument("--hop-ports-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_hop:
        asyncio.run(_naive_hop(args.naive_hop, args.hop_ports_file))
        return 0
    if args.quick:
        args.requests, args.seconds, args.models = min(args.requests, 400), min(args.seconds, 3.0), 0
        args.only = args.only or "half_plus_two"
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    workers = [int(n) for n in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        build_models(repo)
        processes = []
        try:
            node_process, node = start_node(workdir)
            processes.append(node_process)
            direct = f"127.0.0.1:{node['grpc']}"
            hop, hop_ports = start_hop(direct, workdir)
            processes.append(hop)
            targets = {"direct": direct, "naive hop": f"127.0.0.1:{hop_ports['grpc']}"}
            pids = {"node": node["pid"], "naive hop": hop.pid}
            # Every front end is a sidecar of the same node, so all paths use the same node process.
            fronts = [(front_label(n, workers), REPO, ("--workers", str(n)) if n != 1 else ()) for n in workers]
            if "haproxy" in args.data_plane.split(","):
                fronts.append(("tfscache haproxy", REPO, ("--data-plane", "haproxy")))
            if args.baseline_tree is not None:
                fronts.insert(0, ("tfscache (baseline tree)", args.baseline_tree.resolve(), ()))
            for i, (label, tree, extra) in enumerate(fronts):
                process, ports, _ = start_serve(repo, workdir, "--node-address",
                                                f"127.0.0.1:{node['grpc']},{node['rest']}",
                                                "--set", f"node.state_dir={workdir / f'state{i}'}", *extra, tree=tree)
                processes.append(process)
                targets[label], pids[label] = f"127.0.0.1:{ports['grpc']}", process.pid
            names = args.only.split(",") if args.only else ["half_plus_two", "slow_5ms"]
            warm(targets, names)
            results = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(), "models": [],
                       "accounting_us": {"tfscache": bench_accounting(REPO)}}
            if args.baseline_tree is not None:
                results["accounting_us"]["tfscache (baseline tree)"] = bench_accounting(args.baseline_tree.resolve())
            for name in names:
                results["models"].append(bench_model(name, targets, args.requests, args.seconds, pids,
                                                     concurrencies, args.client_processes))
                print(json.dumps(results["models"][-1], indent=1), file=sys.stderr)
            results["workers"] = workers
            results["frontend_rss_mb"] = {label: round(_rss(pids[label]) / 2**20, 1)
                                          for label in pids if label.startswith("tfscache")}
        finally:
            for process in reversed(processes):
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        if args.models:
            results["startup"] = bench_startup(workdir, args.models)
    print(json.dumps(results, indent=1))
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
