#!/usr/bin/env python
"""Benchmark: Triton through `tfscache serve --backend triton` versus straight to the node, same run.

    .venv/bin/python scripts/bench_triton.py [--requests 1000] [--seconds 10] [--rounds 11]
        [--client-processes 4] [--workers 1,2,4] [--concurrency 16,64] [--quick] [--json F]

1. Builds a Triton repository of python-backend models (tests/support/models/triton.py, no
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
   ``--workers 1,2,4``: the embedded serve runs with the first count, and one sidecar serve
   per other count in front of the same tritonserver; every one is a path of its own
   ("tfscache w=N"), measured in the same run at every ``--concurrency``. A front end's CPU
   is its serve process and children (control process and workers, from /proc) without
   the node's tree.
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench_frontend import start_hop, throughput  # noqa: E402  (scripts/ is the script's own directory)
from support.models import triton as tritonmodels  # noqa: E402
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


def start_serve(repo: Path, workdir: Path, *extra: str, name: str = "serve") -> tuple[subprocess.Popen, dict, dict]:
    """tfscache serve --backend triton --local-nodes 1 (``extra``: more flags); its ports and its
    node's (from the log)."""
    process, ports, log_path = _serve(repo, workdir, name, "--local-nodes", "1", *extra)
    node = NODE_LINE.search(log_path.read_text(errors="replace"))
    if node is None:
        stop(process)
        raise SystemExit(f"no 'node0 serving' line in {log_path}")
    pid, grpc_port, rest_port = map(int, node.groups())
    return process, ports, {"pid": pid, "grpc": grpc_port, "rest": rest_port}


def start_sidecar(repo: Path, workdir: Path, node: dict, *extra: str, name: str) -> tuple[subprocess.Popen, dict]:
    """tfscache serve --backend triton as a sidecar of ``node`` (the embedded serve's tritonserver)."""
    process, ports, _ = _serve(repo, workdir, name, "--node-address", f"127.0.0.1:{node['grpc']},{node['rest']}",
                               *extra)
    return process, ports


def _serve(repo: Path, workdir: Path, name: str, *extra: str) -> tuple[subprocess.Popen, dict, Path]:
    ports_file, log_path = workdir / f"{name}.ports.json", workdir / f"{name}.log"
    log = open(log_path, "ab")
    process = subprocess.Popen([PYTHON, "-m", "tfscache", "serve", "--backend", "triton",
                                "--model-repository", str(repo),
                                "--grpc-port", "0", "--rest-port", "0", "--admin-port", "0",
                                "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                                "--set", f"node.state_dir={workdir / f'{name}.state'}", *extra],
                               cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"serve did not start (exit {process.returncode}); see {log_path}:\n"
                             + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.02)
    return process, json.loads(ports_file.read_text()), log_path


def _workers_flag(n: int) -> tuple[str, ...]:
    return ("--workers", str(n)) if n != 1 else ()


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
    for label, target in sorted(targets.items(), key=lambda item: not item[0].startswith("tfscache")):  # load first
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


def _cpu(who: str, pid: int, node_pid: int) -> float:
    """CPU seconds of the node with its children (the python stubs), or of a front end: the serve
    process and its children (its workers with ``--workers N``) but not the node's tree (an
    embedded serve's child)."""
    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
        if who != "node":
            node = {p.pid for p in tree if p.pid == node_pid}
            if node:
                node |= {p.pid for p in psutil.Process(node_pid).children(recursive=True)}
            tree = [p for p in tree if p.pid not in node]
        total = 0.0
        for p in tree:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total
    except psutil.NoSuchProcess:
        return 0.0


def fronts(labels) -> list[str]:
    """The paths through tfscache ("tfscache", or "tfscache w=N" per worker count)."""
    return [label for label in labels if label.startswith("tfscache")]


def bench_warm(name: str, targets: dict[str, str], n: int, seconds: float, pids: dict[str, int],
               processes: int, concurrencies: tuple[int, ...], cpu) -> dict:
    """c=1 latency over every path (alternating blocks); throughput at each concurrency from
    ``processes`` client processes, with each process tree's CPU per request (``cpu(who, pid)``)."""
    calls, channels = raw_calls(name, targets)
    s = alternate(calls, n)
    for channel in channels:
        channel.close()
    result = {"model": name, "requests_c1": len(s["direct"]), "concurrencies": list(concurrencies)}
    for label in targets:
        result[f"{label}_p50_ms"] = pct(s[label], 50) * 1e3
        result[f"{label}_p99_ms"] = pct(s[label], 99) * 1e3
    for label in fronts(targets):
        prefix = "" if label == "tfscache" else f"{label}_"
        result[f"{prefix}added_p50_ms"] = result[f"{label}_p50_ms"] - result["direct_p50_ms"]
        result[f"{prefix}added_p99_ms"] = result[f"{label}_p99_ms"] - result["direct_p99_ms"]
    for c in concurrencies:
        for label, target in targets.items():
            own = {who: pid for who, pid in pids.items() if who in (label, "node")}
            rps, used = throughput(target, infer_bytes(name), c, seconds, processes, method=INFER, pids=own, cpu=cpu)
            result[f"{label}_rps_c{c}"] = rps
            for who in own:  # CPU time per request of each process (tree) on this path
                result[f"{label}_c{c}_{who}_cpu_us_per_request"] = used[who] / (rps * seconds) * 1e6
        for label in targets:
            result[f"{label}_ratio_c{c}"] = result[f"{label}_rps_c{c}"] / result[f"direct_rps_c{c}"]
        if "tfscache" in targets:
            result[f"throughput_ratio_c{c}"] = result[f"tfscache_ratio_c{c}"]
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


def warm_table(r: dict) -> list[str]:
    """One model's warm figures: every path's latency at c=1, and per concurrency its throughput,
    ratio to direct and CPU per request of the front end and the node."""
    cs = r.get("concurrencies", [16])
    labels = [label for label in ("direct", "naive hop") if f"{label}_p50_ms" in r]
    rps = f"_rps_c{cs[0]}"
    labels += sorted({k[:-len(rps)] for k in r if k.startswith("tfscache") and k.endswith(rps)},
                     key=lambda label: (len(label), label))
    lines = [f"Warm ModelInfer on {r['model']}, pre-serialized requests over raw gRPC channels:", "",
             "| path | p50 ms (c=1) | p99 ms (c=1) |" + "".join(
                 f" req/s c={c} | ratio to direct c={c} | vs 1 worker c={c} | front-end CPU µs/req c={c} "
                 f"| node CPU µs/req c={c} |" for c in cs), "|" + "---|" * (3 + 5 * len(cs))]
    one = "tfscache w=1" if "tfscache w=1_rps_c" + str(cs[0]) in r else None
    for label in labels:
        shown = {"naive hop": "naive grpc.aio hop", "tfscache": "through tfscache"}.get(label, label)
        row = f"| {shown} | {r[f'{label}_p50_ms']:.2f} | {r[f'{label}_p99_ms']:.2f} |"
        for c in cs:
            front = "–" if label == "direct" else f"{r[f'{label}_c{c}_{label}_cpu_us_per_request']:.0f}"
            ratio = r.get(f"{label}_ratio_c{c}", r[f"{label}_rps_c{c}"] / r[f"direct_rps_c{c}"])
            versus = "–" if one is None or not label.startswith("tfscache") else \
                f"{r[f'{label}_rps_c{c}'] / r[f'{one}_rps_c{c}']:.2f}"
            row += (f" {r[f'{label}_rps_c{c}']:.0f} | {ratio:.2f} | {versus} | {front} "
                    f"| {r[f'{label}_c{c}_node_cpu_us_per_request']:.0f} |")
        lines.append(row)
    return lines


def markdown(figures: dict) -> str:
    lines = [f"Machine: {figures['machine']}"]
    for r in figures.get("warm", []):
        lines += ["", *warm_table(r)]
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
    parser.add_argument("--workers", default="1",
                        help="comma-separated worker counts (tfscache serve --workers N), e.g. 1,2,4: the first "
                             "is the embedded serve, each other one a sidecar of its node, all in the same run")
    parser.add_argument("--concurrency", default="16", help="comma-separated concurrencies for throughput")
    parser.add_argument("--json", help="write the figures as JSON here")
    args = parser.parse_args()
    workers = [int(n) for n in args.workers.split(",")]
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    label = (lambda n: "tfscache") if workers == [1] else (lambda n: f"tfscache w={n}")
    if args.quick:
        args.requests, args.seconds = min(args.requests, 300), min(args.seconds, 3.0)
        args.skip = sorted({*args.skip, "clients", "cold"})
    figures = {"machine": machine(), "command": " ".join(sys.argv), "workers": workers}
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        tritonmodels.build_triton_models(repo, synthetic=args.rounds + 2, sleep_ms=args.sleep_ms)
        process, ports, node = start_serve(repo, workdir, *_workers_flag(workers[0]))
        hop, sidecars = None, []
        try:
            grpc_targets = {"direct": f"127.0.0.1:{node['grpc']}", "tfscache": f"127.0.0.1:{ports['grpc']}"}
            http_targets = {"direct": f"127.0.0.1:{node['rest']}", "tfscache": f"127.0.0.1:{ports['rest']}"}
            figures["warm"] = []
            if "warm" not in args.skip:
                hop, hop_ports = start_hop(grpc_targets["direct"], workdir)  # the floor, in its own process
                warm_targets = {"direct": grpc_targets["direct"], "naive hop": f"127.0.0.1:{hop_ports['grpc']}",
                                label(workers[0]): grpc_targets["tfscache"]}
                warm_pids = {"node": node["pid"], "naive hop": hop.pid, label(workers[0]): process.pid}
                for n in workers[1:]:  # sidecars of the same node: every path hits one tritonserver
                    sidecar, sidecar_ports = start_sidecar(repo, workdir, node, *_workers_flag(n), name=f"w{n}")
                    sidecars.append(sidecar)
                    warm_targets[label(n)], warm_pids[label(n)] = f"127.0.0.1:{sidecar_ports['grpc']}", sidecar.pid
                for name in ("addk_1", "sleep_ms"):
                    figures["warm"].append(bench_warm(name, warm_targets, args.requests, args.seconds, warm_pids,
                                                      args.client_processes, concurrencies,
                                                      lambda who, pid: _cpu(who, pid, node["pid"])))
                    print(json.dumps(figures["warm"][-1], indent=1), file=sys.stderr)
                for sidecar in sidecars:
                    stop(sidecar)
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
            for sidecar in sidecars:
                stop(sidecar)
            if hop is not None:
                stop(hop)
            stop(process)
            try:  # serve stops its node; never leave one behind
                left = psutil.Process(node["pid"])
                if "tritonserver" in left.name():
                    left.kill()
            except psutil.NoSuchProcess:
                pass
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(markdown(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
