#!/usr/bin/env python
"""Benchmark: warm Predict through `tfscache serve` (each data plane) versus straight to the node,
nginx's grpc_pass and a naive grpc.aio byte hop, same run.

    .venv/bin/python scripts/bench_frontend.py [--requests 2000] [--seconds 10] [--concurrency 16,64]
        [--client-processes 4] [--workers 1,2,4] [--data-plane python,haproxy,haproxy-shared] [--proxy-listen unix]
        [--cold-rounds 11] [--baseline-tree DIR] [--quick] [--out results.json]

1. Builds half_plus_two, ``slow_5ms`` (a graph of chained 256x256 matmuls taking about 5 ms
   per call, calibrated here) and copies of half_plus_two for the cold requests
   (``cold_NNN``) into a temporary repository.
2. Starts one ``tfscache node`` and, in front of it, every path (scripts/benchlib.py):
   ``nginx grpc_pass`` (one worker, keep-alive upstream; skipped, with the reason printed
   and in the JSON, where nginx is not installed: ``apt-get install nginx-light``), the naive
   hop (a grpc.aio server forwarding each call's bytes on one channel, nothing else: the floor
   a Python gRPC proxy reaches), ``tfscache serve`` as a sidecar of that node for each data
   plane (``tfscache``: Python; ``tfscache haproxy``), and optionally one more from
   ``--baseline-tree`` (another checkout: a before/after in the same run). Every path hits
   the same node process. nginx and the hop listen on UNIX sockets (``--proxy-listen tcp``:
   TCP ports, like tfscache's).
3. Per model, warm-up, then at concurrency 1 it alternates blocks of requests over every
   path and reports p50/p99 of each and what each adds over direct; at each concurrency it
   runs each path for ``--seconds`` from ``--client-processes`` client processes (not
   threads: one Python client process would be the bottleneck) and reports throughput, the
   ratio to direct, and CPU per request of each process group, from /proc over the timed
   window: tfscache's Python processes (the serve and its front-end children), its HAProxy
   (master and workers), nginx, the hop, the node. On the haproxy data plane it also reports
   the share of requests HAProxy routed itself (its stick table).
   ``--workers 1,2,4``: one ``tfscache serve --workers N`` per N, all sidecars of the same
   node, every one measured in the same run (a table per model by N).
4. REST at c=1 on half_plus_two: the node's own REST port against each tfscache data plane.
5. Cold requests: ``--cold-rounds`` rounds, each the first Predict of a model not resident
   (a fresh ``cold_NNN`` per path and round, order turning every round), through each
   tfscache data plane; the model is evicted (admin API) after each. Medians.
6. Front-end RSS and start-up time with 10,000 model directories in the repository
   (sidecar mode against a running node, so start-up is the front end's own).
7. A summary: one row per path, and issue 31's goals met or not, with the numbers.

Clients send pre-serialized request bytes over raw channels, so the client's own cost is
as small as Python allows; clients, proxies and node share this machine's cores. Prints
JSON, then Markdown tables. ``--quick``: half_plus_two only, short, 3 cold rounds, no start-up
test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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

from benchlib import cpu, measure, proxies, report  # noqa: E402  (scripts/ is the script's own directory)

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
    """The results as docs/BENCHMARKS.md's tables, the summary last."""
    lines = ["| code | one warm request's accounting, µs |", "|---|---|"]
    lines += [f"| {label} | {us:.2f} |" for label, us in results.get("accounting_us", {}).items()]
    lines.append("")
    for model in results["models"]:
        lines += [f"### {model['model']}", "", *report.paths_table(model), ""]
        if results.get("workers", [1]) != [1]:
            lines += [f"{model['model']} by workers:", "", *workers_table(model, results["workers"]), ""]
    if results.get("rest"):
        lines += ["REST :predict on half_plus_two, c=1:", "", "| path | p50 ms | p99 ms |", "|---|---|---|"]
        lines += [f"| {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |" for label, r in results["rest"].items()]
        lines.append("")
    if results.get("cold"):
        cold = results["cold"]
        lines += [f"Cold Predict (a model not resident), {cold['rounds']} rounds:", "",
                  "| path | median ms | median of per-round differences to the first ms |", "|---|---|---|"]
        lines += [f"| {label} | {c['median_ms']:.1f} | {c['added_median_vs_base_ms']:+.1f} |"
                  for label, c in cold["paths"].items()]
        lines.append("")
    return "\n".join(lines + report.summary_markdown(results["summary"]))


def warm(targets: dict[str, str], names: list[str]) -> None:
    """Each front end loads each model (twice round: every sidecar's cache has synced with the node,
    and they all want the same models, so none unloads another's), before anything is timed."""
    for _ in range(2):
        for name in names:
            for label, target in targets.items():
                if label.startswith("tfscache"):
                    with grpc.insecure_channel(target) as channel:
                        channel.unary_unary(PREDICT)(predict_bytes(name), timeout=120)


def _check_rest(answer: bytes) -> None:
    if json.loads(answer) != {"predictions": [3.0]}:
        raise SystemExit(f"wrong REST answer: {answer[:200]!r}")


def _cold_paths(fronts: dict[str, tuple[str, int]]) -> tuple[dict, dict]:
    """Per tfscache path: its first Predict of a model, and the admin evict that takes it away."""
    from tfscache.admin.client import AdminClient

    firsts, resets = {}, {}
    for label, (target, admin_port) in fronts.items():
        def first(name: str, target=target) -> None:
            with grpc.insecure_channel(target) as channel:
                channel.unary_unary(PREDICT)(predict_bytes(name), timeout=120)

        def reset(name: str, admin_port=admin_port) -> None:
            with AdminClient(f"127.0.0.1:{admin_port}") as admin:
                admin.evict(name)  # returns once the cache saw it unloaded

        firsts[label], resets[label] = first, reset
    return firsts, resets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--requests", type=int, default=2000, help="requests per path at concurrency 1")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per path and concurrency")
    parser.add_argument("--concurrency", default="16,64", help="comma-separated concurrencies for throughput")
    parser.add_argument("--client-processes", type=int, default=4, help="client processes for throughput")
    parser.add_argument("--models", type=int, default=10_000, help="model directories for the start-up test")
    parser.add_argument("--cold-rounds", type=int, default=11, help="cold-request rounds (after one warm-up)")
    parser.add_argument("--baseline-tree", type=Path,
                        help="also run the front end from this checkout (e.g. the commit before a change): "
                             "a same-run before/after")
    parser.add_argument("--workers", default="1",
                        help="comma-separated worker counts (tfscache serve --workers N), each its own front end "
                             "in the same run, e.g. 1,2,4")
    parser.add_argument("--data-plane", default="python,haproxy",
                        help="comma-separated data planes (python, haproxy, haproxy-shared): the paths "
                             "'tfscache' (or 'tfscache w=N'), 'tfscache haproxy' and 'tfscache haproxy "
                             "shared' (--node-connections shared)")
    parser.add_argument("--proxy-listen", choices=("unix", "tcp"), default="unix",
                        help="where nginx and the naive hop listen: UNIX sockets, or TCP ports like tfscache's")
    parser.add_argument("--only", help="comma-separated models (half_plus_two, slow_5ms); default both")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 400 requests at c=1, 3 s per path, half_plus_two, 3 cold rounds, "
                             "no start-up test")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seconds, args.models = min(args.requests, 400), min(args.seconds, 3.0), 0
        args.cold_rounds = min(args.cold_rounds, 3)
        args.only = args.only or "half_plus_two"
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    workers = [int(n) for n in args.workers.split(",")]
    planes = args.data_plane.split(",")
    names = args.only.split(",") if args.only else ["half_plus_two", "slow_5ms"]
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        build_models(repo)
        for i in range(args.cold_rounds * 2 + 1):  # a fresh model per data plane and round, and a warm-up
            shutil.copytree(repo / "half_plus_two", repo / f"cold_{i:03d}")
        results = {"machine": report.machine(), "command": " ".join(sys.argv), "cpus": os.cpu_count(),
                   "load_average_at_start": os.getloadavg(), "models": []}
        processes = []
        try:
            node_process, node = start_node(workdir)
            processes.append(node_process)
            direct = f"127.0.0.1:{node['grpc']}"
            targets, meters, started, results["skipped"] = proxies.proxy_paths(direct, node["pid"], workdir,
                                                                               args.proxy_listen)
            processes += started
            # Every front end is a sidecar of the same node, so all paths use the same node process.
            fronts = []
            if "python" in planes:
                fronts += [(front_label(n, workers), REPO, ("--workers", str(n)) if n != 1 else ()) for n in workers]
            if "haproxy" in planes:
                fronts.append(("tfscache haproxy", REPO, ("--data-plane", "haproxy")))
            if "haproxy-shared" in planes:  # HAProxy keeps its connections to the node
                fronts.append(("tfscache haproxy shared", REPO,
                               ("--data-plane", "haproxy", "--node-connections", "shared")))
            if args.baseline_tree is not None:
                fronts.insert(0, ("tfscache (baseline tree)", args.baseline_tree.resolve(), ()))
            rest_targets, state_dirs, admin, serve_pids = {"direct": f"127.0.0.1:{node['rest']}"}, {}, {}, {}
            for i, (label, tree, extra) in enumerate(fronts):
                state_dirs[label] = workdir / f"state{i}"
                process, ports, _ = start_serve(repo, workdir, "--node-address",
                                                f"127.0.0.1:{node['grpc']},{node['rest']}", "--admin-port", "0",
                                                "--set", f"node.state_dir={state_dirs[label]}", *extra, tree=tree)
                processes.append(process)
                targets[label], serve_pids[label] = f"127.0.0.1:{ports['grpc']}", process.pid
                rest_targets[label], admin[label] = f"127.0.0.1:{ports['rest']}", ports["admin"]
                haproxy = "--data-plane" in extra
                meters[label] = cpu.serve_meter(process.pid, node["pid"],
                                                     state_dir=state_dirs[label] if haproxy else None)
            warm(targets, names)
            for label in ("tfscache haproxy", "tfscache haproxy shared"):
                if label in targets:
                    results.setdefault("routed_before_timing", {})[label] = cpu.wait_routed(
                        targets[label], PREDICT, {name: predict_bytes(name) for name in names},
                        state_dirs[label])
            results["accounting_us"] = {"tfscache": bench_accounting(REPO)}
            if args.baseline_tree is not None:
                results["accounting_us"]["tfscache (baseline tree)"] = bench_accounting(args.baseline_tree.resolve())
            for name in names:
                results["models"].append(measure.bench_warm(name, predict_bytes(name), targets, meters,
                                                             args.requests, args.seconds, concurrencies,
                                                             args.client_processes, PREDICT))
                print(json.dumps(results["models"][-1], indent=1), file=sys.stderr)
            results["rest"] = measure.rest_latency(
                {label: t for label, t in rest_targets.items() if label == "direct" or label in targets},
                "/v1/models/half_plus_two:predict", b'{"instances": [2.0]}', args.requests, _check_rest)
            cold_fronts = {label: (targets[label], admin[label]) for label, _, _ in fronts
                           if label in (front_label(1, workers), "tfscache haproxy")}
            if args.cold_rounds and cold_fronts:
                cold_names = [f"cold_{i:03d}" for i in range(args.cold_rounds * len(cold_fronts) + 1)]
                results["cold"] = measure.cold_rounds(cold_names, *_cold_paths(cold_fronts))
                print(json.dumps(results["cold"], indent=1), file=sys.stderr)
            results["workers"] = workers
            results["frontend_rss_mb"] = {label: round(_rss(pid) / 2**20, 1) for label, pid in serve_pids.items()}
        finally:
            for process in reversed(processes):
                proxies.stop(process)
        if args.models:
            results["startup"] = bench_startup(workdir, args.models)
    tiny = "half_plus_two" if "half_plus_two" in names else names[0]
    results["summary"] = report.summarize(results["models"], tiny, results.get("rest"), results.get("cold"),
                                            results["skipped"])
    print(json.dumps(results, indent=1))
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
