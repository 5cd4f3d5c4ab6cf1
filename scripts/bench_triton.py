#!/usr/bin/env python
"""Benchmark: Triton through `tfscache serve --backend triton` (each data plane) versus straight to
the node, nginx's grpc_pass and a naive grpc.aio byte hop, same run.

    .venv/bin/python scripts/bench_triton.py [--requests 1000] [--seconds 10] [--rounds 11]
        [--client-processes 4] [--workers 1,2,4] [--concurrency 16,64] [--data-plane python,haproxy,haproxy-shared]
        [--proxy-listen unix] [--skip PART] [--quick] [--json F]

1. Builds a Triton repository of python-backend models (tests/support/models/triton.py, no
   tensorflow): addk_1 .. addk_N (y = x + k, tiny) and ``sleep_ms`` sleeping --sleep-ms
   (5) ms per request, the counterparts of half_plus_two and slow_5ms in
   scripts/bench_frontend.py.
2. Starts ``tfscache serve --backend triton --local-nodes 1`` (ports 0, --ports-file, an
   admin port; the path ``tfscache``) and reads its node's ports from the serve log ("node0
   serving: pid P, gRPC G, REST R"), so every path hits the same tritonserver process. In
   front of that node (scripts/benchlib.py): ``nginx grpc_pass`` (skipped, with the reason
   printed and in the JSON, where nginx is not installed: ``apt-get install nginx-light``),
   the naive hop (the floor a Python gRPC proxy reaches), and with ``--data-plane haproxy``
   a sidecar ``tfscache serve --data-plane haproxy`` (the path ``tfscache haproxy``).
   nginx and the hop listen on UNIX sockets (``--proxy-listen tcp``: TCP ports).
3. Warm ModelInfer, per model (addk_1, sleep_ms): warm-up, then at concurrency 1 blocks
   of requests alternate over every path (p50 and p99 of each); at each --concurrency each
   path runs for --seconds from --client-processes client processes: throughput, the ratio
   to direct, and CPU per request of each process group over the timed window (from /proc):
   tfscache's Python processes (serve and its children, never tritonserver's tree), its
   HAProxy (master and workers), nginx, the hop, the node; and the share HAProxy routed.
   The requests are tritonclient.grpc's ``ModelInferRequest`` (x = [2.0], FP32) serialized
   once and sent over raw gRPC channels, so the client's own cost is as small as Python
   allows; every answer is checked (y = x + k).
   ``--workers 1,2,4``: the embedded serve runs with the first count, and one sidecar serve
   per other count in front of the same tritonserver ("tfscache w=N"), measured in the same
   run at every ``--concurrency``.
4. REST (``rest``): POST /v2/models/addk_1/infer at c=1 (http.client, keep-alive), the node's
   own REST port against each tfscache data plane.
5. ``clients``: at concurrency 1 on addk_1, ``tritonclient.grpc`` and ``tritonclient.http``
   InferenceServerClient.infer, direct against the embedded serve: what a user's client costs.
6. ``cold``: --rounds rounds over models not loaded yet, in alternating order: a first
   ModelInfer through tfscache (the cache loads the model: RepositoryModelLoad, confirmed
   in the repository index) versus RepositoryModelLoad + ModelInfer straight to the node
   (the baseline), with tritonclient.grpc; between the two the model is unloaded (tfscache
   evict on the admin port; RepositoryModelUnload directly) and the index polled until it
   is UNAVAILABLE. Medians of both and of the per-round differences.
7. ``dataplane-cold``: --rounds rounds, a fresh model per data plane and round, order turning:
   the first ModelInfer through a Python-data-plane sidecar and through the haproxy one
   (both sidecars of the same tritonserver), evicted after each. Medians.
8. A summary: one row per path on addk_1, and issue 31's goals met or not, with the numbers.

Only this client side imports tritonclient; the serve process never does. Prints
Markdown (docs/BENCHMARKS.md holds a run); --json F writes the figures. Every process
it started is stopped on exit (SIGTERM to serve, which stops its tritonserver).
"""

from __future__ import annotations

import argparse
import json
import re
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

from benchlib import cpu, measure, proxies, report  # noqa: E402  (scripts/ is the script's own directory)
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
        proxies.stop(process)
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
            proxies.stop(process)
            raise SystemExit(f"serve did not start (exit {process.returncode}); see {log_path}:\n"
                             + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.02)
    return process, json.loads(ports_file.read_text()), log_path


def _workers_flag(n: int) -> tuple[str, ...]:
    return ("--workers", str(n)) if n != 1 else ()


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


def bench_clients(name: str, grpc_targets: dict[str, str], http_targets: dict[str, str], n: int) -> dict:
    calls, clients = client_calls(name, grpc_targets, http_targets)
    s = measure.alternate(calls, n)
    for client in clients:
        client.close()
    result = {"model": name, "requests_c1": len(s["grpc direct"])}
    for proto in ("grpc", "rest"):
        for label in grpc_targets:
            result[f"{proto}_{label}_p50_ms"] = measure.pct(s[f"{proto} {label}"], 50) * 1e3
            result[f"{proto}_{label}_p99_ms"] = measure.pct(s[f"{proto} {label}"], 99) * 1e3
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


def _check_rest(answer: bytes) -> None:
    outputs = json.loads(answer).get("outputs", [{}])
    if outputs[0].get("name") != "y" or outputs[0].get("data") != [expected_y("addk_1")]:
        raise SystemExit(f"wrong REST answer from addk_1: {answer[:300]!r}")


def dataplane_cold(names: list[str], fronts: dict[str, tuple[str, int]], node_target: str) -> dict:
    """The first ModelInfer of a model not loaded, through each tfscache data plane (``fronts``:
    label -> (gRPC target, admin port), the Python one first); after each, the model is evicted and
    the node's index polled until it is UNAVAILABLE."""
    node = tgrpc.InferenceServerClient(node_target)
    channels = {label: grpc.insecure_channel(target) for label, (target, _) in fronts.items()}
    admins = {label: AdminClient(f"127.0.0.1:{port}") for label, (_, port) in fronts.items()}
    firsts, resets = {}, {}
    for label in fronts:
        def first(name: str, call=channels[label].unary_unary(INFER)) -> None:
            check_answer(name, call(infer_bytes(name), timeout=120))

        def reset(name: str, admin=admins[label]) -> None:
            admin.evict(name)  # returns once the cache saw it unloaded
            until_unavailable(node, name)

        firsts[label], resets[label] = first, reset
    try:
        return measure.cold_rounds(names, firsts, resets)
    finally:
        for closable in (*channels.values(), *admins.values(), node):
            closable.close()


def markdown(figures: dict) -> str:
    lines = [f"Machine: {figures['machine']}"]
    for r in figures.get("warm", []):
        lines += ["", f"Warm ModelInfer on {r['model']}, pre-serialized requests over raw gRPC channels:", "",
                  *report.paths_table(r)]
    if figures.get("rest"):
        lines += ["", "REST /v2/models/addk_1/infer, c=1:", "", "| path | p50 ms | p99 ms |", "|---|---|---|"]
        lines += [f"| {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |" for label, r in figures["rest"].items()]
    if figures.get("dataplane_cold"):
        cold = figures["dataplane_cold"]
        lines += ["", f"Cold ModelInfer by data plane, {cold['rounds']} rounds:", "",
                  "| path | median ms | median of per-round differences to the first ms |", "|---|---|---|"]
        lines += [f"| {label} | {c['median_ms']:.1f} | {c['added_median_vs_base_ms']:+.1f} |"
                  for label, c in cold["paths"].items()]
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
    if cold:
        lines += _cold_table(cold)
    if figures.get("summary"):  # last
        lines += ["", *report.summary_markdown(figures["summary"])]
    return "\n".join(lines)


def _cold_table(cold: dict) -> list[str]:
    """The cold load through tfscache against a direct RepositoryModelLoad + ModelInfer, and its parts."""
    return ["", "Cold load (first ModelInfer of a model not loaded):", "",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per path at concurrency 1")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per path and concurrency")
    parser.add_argument("--rounds", type=int, default=11, help="cold-load rounds (after one warm-up)")
    parser.add_argument("--sleep-ms", type=int, default=5, help="the sleep model's time per request")
    parser.add_argument("--skip", choices=("warm", "rest", "clients", "cold", "dataplane-cold"), action="append",
                        default=[], help="leave a part out (repeatable)")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="client processes for the throughput (not threads)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: 300 requests at c=1, 3 s per path, 3 cold rounds by data plane, "
                             "no tritonclient part and no cold load against direct")
    parser.add_argument("--workers", default="1",
                        help="comma-separated worker counts (tfscache serve --workers N), e.g. 1,2,4: the first "
                             "is the embedded serve, each other one a sidecar of its node, all in the same run")
    parser.add_argument("--data-plane", default="python,haproxy",
                        help="comma-separated data planes: python is the embedded serve ('tfscache'); haproxy "
                             "adds 'tfscache haproxy', a sidecar of the same tritonserver; haproxy-shared "
                             "'tfscache haproxy shared', one with --node-connections shared")
    parser.add_argument("--proxy-listen", choices=("unix", "tcp"), default="unix",
                        help="where nginx and the naive hop listen: UNIX sockets, or TCP ports like tfscache's")
    parser.add_argument("--concurrency", default="16,64", help="comma-separated concurrencies for throughput")
    parser.add_argument("--json", help="write the figures as JSON here")
    args = parser.parse_args()
    workers = [int(n) for n in args.workers.split(",")]
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    haproxy = "haproxy" in args.data_plane.split(",")
    shared = "haproxy-shared" in args.data_plane.split(",")  # HAProxy keeps its node connections
    label = (lambda n: "tfscache") if workers == [1] else (lambda n: f"tfscache w={n}")
    if args.quick:
        args.requests, args.seconds = min(args.requests, 300), min(args.seconds, 3.0)
        args.rounds = min(args.rounds, 3)
        args.skip = sorted({*args.skip, "clients", "cold"})
    figures = {"machine": report.machine(), "command": " ".join(sys.argv), "workers": workers, "skipped": {}}
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        workdir = Path(tmp)
        repo = workdir / "models"
        # addk_2.. for the cold load against direct, then two fresh ones a round for the data planes'
        tritonmodels.build_triton_models(repo, synthetic=3 * args.rounds + 4, sleep_ms=args.sleep_ms)
        process, ports, node = start_serve(repo, workdir, *_workers_flag(workers[0]))
        started, sidecars = [], []  # nginx, the hop, the haproxy sidecar; the worker sidecars
        try:
            direct = f"127.0.0.1:{node['grpc']}"
            grpc_targets = {"direct": direct, "tfscache": f"127.0.0.1:{ports['grpc']}"}
            http_targets = {"direct": f"127.0.0.1:{node['rest']}", "tfscache": f"127.0.0.1:{ports['rest']}"}
            targets, meters, others, figures["skipped"] = proxies.proxy_paths(direct, node["pid"], workdir,
                                                                              args.proxy_listen)
            started += others
            targets[label(workers[0])] = grpc_targets["tfscache"]
            meters[label(workers[0])] = cpu.serve_meter(process.pid, node["pid"], serve_node_pid=node["pid"])
            for n in workers[1:]:  # sidecars of the same node: every path hits one tritonserver
                sidecar, sidecar_ports = start_sidecar(repo, workdir, node, *_workers_flag(n), name=f"w{n}")
                sidecars.append(sidecar)
                targets[label(n)] = f"127.0.0.1:{sidecar_ports['grpc']}"
                meters[label(n)] = cpu.serve_meter(sidecar.pid, node["pid"])
            if haproxy:
                sidecar, sidecar_ports = start_sidecar(repo, workdir, node, "--data-plane", "haproxy", name="haproxy")
                started.append(sidecar)
                state_dir = workdir / "haproxy.state"
                targets["tfscache haproxy"] = f"127.0.0.1:{sidecar_ports['grpc']}"
                http_targets["tfscache haproxy"] = f"127.0.0.1:{sidecar_ports['rest']}"
                haproxy_admin = sidecar_ports["admin"]
                meters["tfscache haproxy"] = cpu.serve_meter(sidecar.pid, node["pid"], state_dir=state_dir)
            if shared:
                sidecar, sidecar_ports = start_sidecar(repo, workdir, node, "--data-plane", "haproxy",
                                                       "--node-connections", "shared", name="shared")
                started.append(sidecar)
                targets["tfscache haproxy shared"] = f"127.0.0.1:{sidecar_ports['grpc']}"
                http_targets["tfscache haproxy shared"] = f"127.0.0.1:{sidecar_ports['rest']}"
                meters["tfscache haproxy shared"] = cpu.serve_meter(sidecar.pid, node["pid"],
                                                                    state_dir=workdir / "shared.state")
            figures["warm"] = []
            if "warm" not in args.skip:
                for name in ("addk_1", "sleep_ms"):
                    # loaded through every front end (they load it) before anything is timed
                    for _, target in sorted(targets.items(), key=lambda item: not item[0].startswith("tfscache")):
                        with grpc.insecure_channel(target) as channel:
                            check_answer(name, channel.unary_unary(INFER)(infer_bytes(name), timeout=120))
                    for routed in ("tfscache haproxy", "tfscache haproxy shared"):
                        if routed in targets:
                            figures.setdefault("routed_before_timing", {})[f"{name} {routed}"] = cpu.wait_routed(
                                targets[routed], INFER, {name: infer_bytes(name)},
                                workdir / ("haproxy.state" if routed == "tfscache haproxy" else "shared.state"))
                    figures["warm"].append(measure.bench_warm(
                        name, infer_bytes(name), targets, meters, args.requests, args.seconds, concurrencies,
                        args.client_processes, INFER, check=lambda answer, name=name: check_answer(name, answer)))
                    print(json.dumps(figures["warm"][-1], indent=1), file=sys.stderr)
            for sidecar in sidecars:
                proxies.stop(sidecar)
            if "rest" not in args.skip:
                figures["rest"] = measure.rest_latency(
                    http_targets, "/v2/models/addk_1/infer",
                    json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [2.0]}]}).encode(),
                    args.requests, _check_rest)
                print(json.dumps(figures["rest"], indent=1), file=sys.stderr)
            if "clients" not in args.skip:
                figures["clients"] = bench_clients("addk_1", grpc_targets, {k: v for k, v in http_targets.items()
                                                                            if k in grpc_targets}, args.requests // 2)
                print(json.dumps(figures["clients"], indent=1), file=sys.stderr)
            if "cold" not in args.skip:
                with AdminClient(f"127.0.0.1:{ports['admin']}") as admin:
                    names = [f"addk_{k}" for k in range(2, args.rounds + 3)]
                    figures["cold"] = bench_cold(names, grpc_targets["tfscache"], grpc_targets["direct"], admin,
                                                 workdir / "serve.log")
                print(json.dumps(figures["cold"], indent=1), file=sys.stderr)
            if "dataplane-cold" not in args.skip and haproxy:
                # like for like: the Python data plane as a sidecar of the same node too
                sidecar, sidecar_ports = start_sidecar(repo, workdir, node, name="python")
                started.append(sidecar)
                names = [f"addk_{k}" for k in range(args.rounds + 3, 3 * args.rounds + 4)]
                figures["dataplane_cold"] = dataplane_cold(
                    names, {"tfscache": (f"127.0.0.1:{sidecar_ports['grpc']}", sidecar_ports["admin"]),
                            "tfscache haproxy": (targets["tfscache haproxy"], haproxy_admin)}, direct)
                figures["dataplane_cold"]["note"] = ("'tfscache' here is a sidecar on the Python data plane, "
                                                     "like 'tfscache haproxy' (the warm 'tfscache' path is the "
                                                     "embedded serve)")
                print(json.dumps(figures["dataplane_cold"], indent=1), file=sys.stderr)
            figures["tfscache_rss_mb"] = round(psutil.Process(process.pid).memory_info().rss / 2**20, 1)
        finally:
            for other in (*sidecars, *reversed(started)):
                proxies.stop(other)
            proxies.stop(process)
            try:  # serve stops its node; never leave one behind
                left = psutil.Process(node["pid"])
                if "tritonserver" in left.name():
                    left.kill()
            except psutil.NoSuchProcess:
                pass
    if figures["warm"]:
        figures["summary"] = report.summarize(figures["warm"], "addk_1", figures.get("rest"),
                                                figures.get("dataplane_cold"), figures["skipped"])
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(markdown(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
