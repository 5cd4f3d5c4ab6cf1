"""What the front-end benchmarks share (scripts/bench_frontend.py, scripts/bench_triton.py).

A *path* is a label and a gRPC target in front of one node process: ``direct`` (the node),
``nginx grpc_pass``, ``naive hop`` (a grpc.aio byte hop, the floor of a Python proxy),
``tfscache`` (the Python data plane, or ``tfscache w=N``) and ``tfscache haproxy`` (issue 31).
Each path has a *meter*: a function giving the CPU seconds used so far by each process group
on that path (the node, the proxy; for a tfscache path, its Python processes and its HAProxy
apart), read from /proc through psutil before and after each timed window.

    bench_warm    p50/p99 at c=1 (blocks alternating over the paths), then req/s at each
                  concurrency from client processes, with CPU per request of each group
    rest_latency  the same c=1 alternation over REST (http.client, keep-alive)
    cold_rounds   the first request for a model not resident, per path, alternating order
    summary       one row per path and the goals of issue 31, met or not, with the numbers

Run as a script it is the naive hop: ``benchlib.py --naive-hop TARGET --listen ADDR
--ports-file F``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
NGINX_INSTALL = "apt-get install nginx-light"
# which goal each figure is judged against (issue 31)
GOAL_P50_VS_NGINX_MS = 0.10
GOAL_REST_P50_VS_NODE_MS = 0.30
GOAL_PYTHON_CPU_US = 100.0
GOAL_RATIO_C16 = 0.85

Meter = Callable[[], dict[str, float]]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def stop(process: subprocess.Popen, grace: float = 60) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_file(path: Path, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Until ``path`` exists; SystemExit if ``process`` exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"{what} did not start (exit {process.returncode})")
        time.sleep(0.01)


# -- CPU per process group ------------------------------------------------------------------

def _seconds(processes) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (a node, a naive hop, nginx's master and workers)."""
    return _seconds(_tree(pid))


def serve_cpu(pid: int, node_pid: int | None = None) -> dict[str, float]:
    """CPU seconds of a ``tfscache serve`` tree in two groups: ``haproxy`` (its HAProxy master and
    workers) and ``tfscache python`` (the serve process and every other descendant: a worker
    front end, a control process), never the node ``node_pid`` nor anything below it (an embedded
    serve's tritonserver). Processes that ended within the window are not counted."""
    tree = _tree(pid)
    left_out: set[int] = set()
    haproxy: list[psutil.Process] = []
    for p in tree:
        try:
            if p.pid == node_pid:
                left_out |= {q.pid for q in _tree(p.pid)}
            elif p.name() == "haproxy":
                group = _tree(p.pid)
                haproxy += [q for q in group if q.pid not in {h.pid for h in haproxy}]
        except psutil.NoSuchProcess:
            continue
    left_out |= {p.pid for p in haproxy}
    return {"tfscache python": _seconds([p for p in tree if p.pid not in left_out]),
            "haproxy": _seconds(haproxy)}


def haproxy_routed(state_dir: Path) -> dict[str, int]:
    """Requests a ``--data-plane haproxy`` serve's HAProxy routed, by ``MODEL@NODE`` (its stick table
    ``inflight``); {} where its runtime socket does not answer."""
    from tfscache.dataplane import config

    routed: dict[str, int] = {}
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(config.runtime_socket_for(Path(state_dir) / "dataplane")))
            sock.sendall(b"show table inflight\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return routed
    for line in answer.decode().splitlines():
        if "key=" in line and "http_req_cnt=" in line:
            key = line.split("key=", 1)[1].split()[0]
            routed[key] = int(line.rsplit("http_req_cnt=", 1)[1].split()[0])
    return routed


def wait_routed(target: str, method: str, requests: dict[str, bytes], state_dir: Path,
                timeout: float = 15.0) -> bool:
    """Sends each model's request through a haproxy data plane until HAProxy counts one as routed
    (the control plane grants a route within a poll or two of a model becoming resident): False if
    one is still not routed after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for name, request in requests.items():
            while True:
                before = haproxy_routed(state_dir)
                call(request, timeout=60)
                after = haproxy_routed(state_dir)
                if any(k.startswith(f"{name}@") and v > before.get(k, 0) for k, v in after.items()):
                    break
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
    return True


def serve_meter(pid: int, node_pid: int, serve_node_pid: int | None = None,
                state_dir: Path | None = None) -> Meter:
    """A tfscache path's meter: its Python processes, its HAProxy, the node (``node_pid``'s tree); with
    ``state_dir`` (a haproxy data plane) also ``routed``, HAProxy's count of requests it routed."""
    def meter() -> dict[str, float]:
        used = {**serve_cpu(pid, serve_node_pid), "node": tree_cpu(node_pid)}
        if state_dir is None:
            del used["haproxy"]  # the Python data plane has none
        else:
            used["routed"] = float(sum(haproxy_routed(state_dir).values()))
        return used
    return meter


def proxy_meter(label: str, pid: int | None, node_pid: int) -> Meter:
    """The meter of direct (``pid`` None: the node only) or of a proxy in its own process tree."""
    if pid is None:
        return lambda: {"node": tree_cpu(node_pid)}
    return lambda: {label: tree_cpu(pid), "node": tree_cpu(node_pid)}


# -- listening addresses for the proxies this script starts ----------------------------------

def listen_address(workdir: Path, name: str, transport: str) -> str:
    """Where a proxy this script starts listens, as a gRPC client dials it: ``unix:PATH`` (no port
    to pick: nothing can take it first), or ``127.0.0.1:PORT`` with ``transport`` "tcp".
    A TCP port is found by binding port 0 and closing it, and the proxy binds it right after:
    another process may take it in between (nginx cannot listen on port 0 and tell its port).
    The race is accepted for this like-for-like mode (tfscache's public ports are TCP)."""
    if transport == "unix":
        return f"unix:{workdir / f'{name}.sock'}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# -- the naive byte hop: the floor a Python gRPC front end can reach ---------------------------

async def _naive_hop(target: str, listen: str, ports_file: Path) -> None:
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
    if not server.add_insecure_port(listen):
        raise SystemExit(f"the naive hop cannot listen on {listen}")
    await server.start()
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"target": listen, "pid": os.getpid()}))
    tmp.rename(ports_file)
    await server.wait_for_termination()


def start_hop(target: str, workdir: Path, transport: str = "unix") -> tuple[subprocess.Popen, str]:
    """The naive hop in its own process in front of ``target``; the address clients dial."""
    ports_file = workdir / f"hop-{time.monotonic_ns()}.json"
    listen = listen_address(workdir, "hop", transport)
    process = subprocess.Popen([PYTHON, __file__, "--naive-hop", target, "--listen", listen,
                                "--ports-file", str(ports_file)], cwd=REPO, stdin=subprocess.DEVNULL)
    wait_for_file(ports_file, process, "the naive hop")
    return process, json.loads(ports_file.read_text())["target"]


# -- nginx grpc_pass --------------------------------------------------------------------------

def nginx_binary() -> str | None:
    """``nginx`` on PATH, or Debian's /usr/sbin/nginx."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")


_NGINX_CONF = """\
# written by scripts/benchlib.py: nginx as a plain gRPC proxy in front of one node
daemon off;
master_process on;
worker_processes 1;  # HAProxy's data plane runs one thread (nbthread 1)
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000000;  # else nginx closes a client's connection after 1000 requests
    upstream node {{
        server {upstream};
        keepalive 64;  # connections to the node are reused, as the node's own clients reuse theirs
        keepalive_requests 100000000;
    }}
    server {{
        listen {listen} http2;
        location / {{ grpc_pass grpc://node; }}
    }}
}}
"""


def start_nginx(upstream: str, workdir: Path, transport: str = "unix") -> tuple[subprocess.Popen | None, str]:
    """nginx (one worker, HTTP/2 in, ``grpc_pass`` with keep-alive to ``upstream``), started with its
    configuration in ``workdir/nginx``: (process, the address clients dial), or (None, why not)."""
    binary = nginx_binary()
    if binary is None:
        return None, f"nginx not found on PATH nor in /usr/sbin: {NGINX_INSTALL}"
    home = workdir / "nginx"
    home.mkdir(exist_ok=True)
    target = listen_address(home, "grpc", transport)  # nginx's listen takes both forms as they are
    (home / "nginx.conf").write_text(_NGINX_CONF.format(dir=home, upstream=upstream, listen=target))
    log = open(home / "nginx-stderr.log", "ab")
    process = subprocess.Popen([binary, "-p", str(home), "-c", str(home / "nginx.conf"), "-e",
                                str(home / "nginx-error.log")], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not _answers(target):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            text = (home / "nginx-error.log").read_text(errors="replace")[-1500:] if (
                home / "nginx-error.log").exists() else ""
            return None, f"nginx did not start (exit {process.returncode}): {text.strip()}"
        time.sleep(0.02)
    return process, target


def _answers(target: str) -> bool:
    """Whether something accepts connections at ``target`` (unix:PATH or host:port)."""
    family, address = (socket.AF_UNIX, target[5:]) if target.startswith("unix:") else (
        socket.AF_INET, (target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1])))
    try:
        with socket.socket(family) as sock:
            sock.settimeout(1)
            sock.connect(address)
        return True
    except OSError:
        return False


# -- latency at c=1 --------------------------------------------------------------------------

def alternate(calls: dict[str, Callable[[], object]], n: int, block: int = 50) -> dict[str, list[float]]:
    """Blocks of ``block`` calls, path after path, so drift hits every path alike; seconds per call."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(max(1, n // block)):
        for label, call in calls.items():
            for _ in range(block):
                t = time.perf_counter()
                call()
                samples[label].append(time.perf_counter() - t)
    return samples


def grpc_calls(targets: dict[str, str], request: bytes, method: str,
               check: Callable[[bytes], object] | None = None) -> tuple[dict, list]:
    """One warm unary call per path over a raw channel (``check`` sees the first answer; later
    answers must be the same bytes); each call made 50 times first."""
    calls, channels = {}, []
    for label, target in targets.items():
        channel = grpc.insecure_channel(target)
        channels.append(channel)
        stub = channel.unary_unary(method)
        good = stub(request, timeout=120)
        if check is not None:
            check(good)

        def call(stub=stub, good=good, label=label):
            if stub(request, timeout=60) != good:
                raise SystemExit(f"a different answer on {label}")

        for _ in range(50):  # warm: connections, caches, routes
            call()
        calls[label] = call
    return calls, channels


def rest_latency(targets: dict[str, str], path: str, body: bytes, n: int,
                 check: Callable[[bytes], object]) -> dict[str, dict[str, float]]:
    """p50/p99 of ``POST path`` at c=1 on each ``host:port``, keep-alive connections (http.client:
    the cheapest Python client), blocks alternating; every answer 200 and ``check``ed once."""
    connections = {label: http.client.HTTPConnection(*target.rsplit(":", 1)) for label, target in targets.items()}
    headers = {"Content-Type": "application/json"}

    def caller(label: str):
        connection = connections[label]

        def call() -> bytes:
            connection.request("POST", path, body, headers)
            answer = connection.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise SystemExit(f"REST {path} on {label}: {answer.status} {data[:300]!r}")
            return data
        return call

    calls = {label: caller(label) for label in targets}
    for call in calls.values():
        check(call())
        for _ in range(50):
            call()
    s = alternate(calls, n)
    for connection in connections.values():
        connection.close()
    return {label: {"p50_ms": pct(v, 50) * 1e3, "p99_ms": pct(v, 99) * 1e3} for label, v in s.items()}


# -- throughput from client processes --------------------------------------------------------

async def _client(target: str, request: bytes, concurrency: int, seconds: float, method: str, barrier) -> int:
    """``concurrency`` callers back to back on one channel for ``seconds``, once every client
    process is connected and warm (``barrier``, which the parent passes too)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for _ in range(10):
            await call(request, timeout=60)
        await asyncio.to_thread(barrier.wait, 300)
        done = 0
        stop_at = time.monotonic() + seconds

        async def caller():
            nonlocal done
            while time.monotonic() < stop_at:
                await call(request, timeout=60)
                done += 1

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return done


def _client_process(args: tuple, barrier, results) -> None:
    results.put(asyncio.run(_client(*args, barrier)))


def throughput(target: str, request: bytes, concurrency: int, seconds: float, processes: int,
               method: str, meter: Meter | None = None) -> tuple[float, dict[str, float]]:
    """Requests per second with ``concurrency`` calls in flight, spread over ``processes`` client
    processes (so the client is not one Python core); and what ``meter`` counted over the timed
    window."""
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
        before = meter() if meter else {}
        time.sleep(seconds)
        after = meter() if meter else {}
        done = sum(results.get(timeout=120) for _ in clients)
    finally:
        for client in clients:
            client.join(30)
            if client.is_alive():
                client.kill()
    return done / seconds, {who: after[who] - before.get(who, 0.0) for who in after}


# -- one model, every path -------------------------------------------------------------------

def bench_warm(model: str, request: bytes, targets: dict[str, str], meters: dict[str, Meter], n: int,
               seconds: float, concurrencies: tuple[int, ...], processes: int, method: str,
               check: Callable[[bytes], object] | None = None) -> dict:
    """p50/p99 at c=1 on every path (alternating blocks), then at each concurrency req/s, the ratio
    to direct, and CPU µs per request of each process group (``cpu_us_c{c}``; ``proxy_cpu_us_c{c}``
    is every group but the node; ``routed_share_c{c}``: what HAProxy routed of the requests)."""
    calls, channels = grpc_calls(targets, request, method, check)
    s = alternate(calls, n)
    for channel in channels:
        channel.close()
    result = {"model": model, "requests_c1": len(s["direct"]), "concurrencies": list(concurrencies), "paths": {}}
    for label in targets:
        result["paths"][label] = {"target": targets[label], "p50_ms": pct(s[label], 50) * 1e3,
                                  "p99_ms": pct(s[label], 99) * 1e3, "mean_ms": statistics.fmean(s[label]) * 1e3}
        result["paths"][label]["added_p50_ms"] = result["paths"][label]["p50_ms"] - pct(s["direct"], 50) * 1e3
    for c in concurrencies:
        for label, target in targets.items():
            rps, used = throughput(target, request, c, seconds, processes, method, meters.get(label))
            path, done = result["paths"][label], max(1.0, rps * seconds)
            path[f"rps_c{c}"] = rps
            path[f"cpu_us_c{c}"] = {who: v / done * 1e6 for who, v in used.items() if who != "routed"}
            path[f"node_cpu_us_c{c}"] = path[f"cpu_us_c{c}"].get("node", float("nan"))
            if label != "direct":
                path[f"proxy_cpu_us_c{c}"] = sum(v for who, v in path[f"cpu_us_c{c}"].items() if who != "node")
            if "routed" in used:
                path[f"routed_share_c{c}"] = used["routed"] / done
        for path in result["paths"].values():
            path[f"ratio_c{c}"] = path[f"rps_c{c}"] / result["paths"]["direct"][f"rps_c{c}"]
    return result


def cold_rounds(names: list[str], firsts: dict[str, Callable[[str], None]],
                resets: dict[str, Callable[[str], None]]) -> dict:
    """The first request for a model not resident, on each path: ``firsts[label](name)`` is timed,
    then ``resets[label](name)`` unloads it. Each round takes a fresh model per path and the
    paths' order turns every round; the first name is a warm-up on every path, not counted.
    Medians, and the median of each path's per-round difference to the first path."""
    labels = list(firsts)
    for label in labels:  # warm-up: connections, the node's first load, page cache
        firsts[label](names[0])
        resets[label](names[0])
    times: dict[str, list[float]] = {label: [] for label in labels}
    rest = names[1:]
    rounds = len(rest) // len(labels)
    for i in range(rounds):
        order = labels[i % len(labels):] + labels[:i % len(labels)]
        for j, label in enumerate(order):
            name = rest[i * len(labels) + j]
            t = time.perf_counter()
            firsts[label](name)
            times[label].append(time.perf_counter() - t)
            resets[label](name)
    base = labels[0]
    out = {"rounds": rounds, "base": base, "paths": {}}
    for label in labels:
        diffs = [a - b for a, b in zip(times[label], times[base])]
        out["paths"][label] = {"median_ms": 1e3 * statistics.median(times[label]),
                               "added_median_vs_base_ms": 1e3 * statistics.median(diffs),
                               "all_ms": [round(1e3 * t, 1) for t in times[label]]}
    return out


# -- tables, goals, summary ------------------------------------------------------------------

def _f(value, spec: str = ".2f") -> str:
    return "–" if value is None or value != value else format(value, spec)


def _groups(cpu: dict[str, float]) -> str:
    """CPU µs per request as table cells: tfscache's Python processes, HAProxy, any other proxy
    (nginx, the naive hop), the node; "–" where the path has no such group."""
    other = [v for who, v in cpu.items() if who not in ("node", "tfscache python", "haproxy")]
    return " | ".join(_f(v, ".0f") for v in (cpu.get("tfscache python"), cpu.get("haproxy"),
                                            sum(other) if other else None, cpu.get("node")))


def paths_table(model: dict) -> list[str]:
    """One model's warm figures: per path p50/p99 at c=1, and per concurrency req/s, the ratio to
    direct, and CPU µs per request of tfscache's Python processes, of HAProxy, of any other proxy
    and of the node."""
    cs = model["concurrencies"]
    head = "| path | p50 ms (c=1) | p99 ms (c=1) | added p50 |" + "".join(
        f" req/s c={c} | ratio c={c} | Python CPU µs/req c={c} | HAProxy CPU µs/req c={c} "
        f"| other proxy CPU µs/req c={c} | node CPU µs/req c={c} |" for c in cs)
    lines = [head, "|" + "---|" * (4 + 6 * len(cs))]
    for label, p in model["paths"].items():
        row = f"| {label} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['added_p50_ms']:+.2f} |"
        for c in cs:
            row += f" {p[f'rps_c{c}']:.0f} | {p[f'ratio_c{c}']:.2f} | {_groups(p[f'cpu_us_c{c}'])} |"
        lines.append(row)
    return lines


def _verdict(goal: str, path: str, value: float | None, limit: float, at_most: bool, unit: str,
             missing: str = "") -> dict:
    if value is None:
        return {"goal": goal, "path": path, "verdict": "not measured", "detail": missing}
    met = value <= limit if at_most else value >= limit
    return {"goal": goal, "path": path, "value": round(value, 4), "limit": limit,
            "verdict": "met" if met else "not met",
            "detail": f"{value:.3g} {unit} ({'≤' if at_most else '≥'} {limit:g} wanted)"}


def judge(models: list[dict], tiny: str, rest: dict | None, cold: dict | None,
          skipped: dict[str, str]) -> list[dict]:
    """Issue 31's goals for every tfscache path, each met or not with its numbers:
    gRPC p50 at c=1 within 0.10 ms of nginx grpc_pass (every model); REST p50 at c=1 within
    0.30 ms of the node's own REST port (``tiny``); at most 100 µs of tfscache's Python CPU per
    request under load (every model and concurrency: the worst); at c=16 at least 0.85 of
    direct (``tiny``); cold requests no slower than on the Python path (medians)."""
    goals = []
    fronts = [label for label in models[0]["paths"] if label.startswith("tfscache")]
    for label in fronts:
        for model in models:
            paths = model["paths"]
            nginx = paths.get("nginx grpc_pass")
            goals.append(_verdict(f"gRPC p50 c=1 within {GOAL_P50_VS_NGINX_MS} ms of nginx grpc_pass, "
                                  f"{model['model']}", label,
                                  None if nginx is None else paths[label]["p50_ms"] - nginx["p50_ms"],
                                  GOAL_P50_VS_NGINX_MS, True, "ms over nginx",
                                  skipped.get("nginx grpc_pass", "nginx not measured")))
        if rest is not None:
            added = rest[label]["p50_ms"] - rest["direct"]["p50_ms"] if label in rest else None
            goals.append(_verdict(f"REST p50 c=1 within {GOAL_REST_P50_VS_NODE_MS} ms of the node's REST, {tiny}",
                                  label, added, GOAL_REST_P50_VS_NODE_MS, True, "ms over the node"))
        worst = [(p["cpu_us_c" + str(c)]["tfscache python"], m["model"], c) for m in models
                 for p in [m["paths"][label]] for c in m["concurrencies"]]
        value, where = (max(worst)[0], f" (worst: {max(worst)[1]} c={max(worst)[2]})") if worst else (None, "")
        verdict = _verdict(f"tfscache Python CPU ≤ {GOAL_PYTHON_CPU_US:g} µs per warm request under load", label,
                           value, GOAL_PYTHON_CPU_US, True, "µs/req")
        verdict["detail"] = verdict.get("detail", "") + where
        goals.append(verdict)
        tiny_paths = next((m["paths"] for m in models if m["model"] == tiny), None)
        ratio = None if tiny_paths is None else tiny_paths[label].get("ratio_c16")
        goals.append(_verdict(f"req/s at c=16 ≥ {GOAL_RATIO_C16} of direct, {tiny}", label, ratio,
                              GOAL_RATIO_C16, False, "of direct", "no c=16 run (--concurrency)"))
    if cold is not None:  # its base (first path) is the Python data plane
        python = cold["paths"][cold["base"]]
        for label, figures in cold["paths"].items():
            if label.startswith("tfscache") and label != cold["base"]:
                goals.append(_verdict(f"cold request no slower than on the Python path ({cold['base']}), "
                                      "median", label, figures["median_ms"], round(python["median_ms"], 2), True,
                                      f"ms (per-round difference: median {figures['added_median_vs_base_ms']:+.1f} ms)"))
    return goals


def summary_rows(models: list[dict], tiny: str, rest: dict | None, cold: dict | None) -> list[dict]:
    """One row per path, on ``tiny``: c=1 latency, REST p50, req/s and ratio at each concurrency,
    CPU µs per request by group (the highest concurrency), cold median."""
    model = next(m for m in models if m["model"] == tiny)
    top = max(model["concurrencies"])
    rows = []
    for label, p in model["paths"].items():
        row = {"path": label, "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"],
               "rest_p50_ms": (rest or {}).get(label, {}).get("p50_ms"),
               **{f"rps_c{c}": p[f"rps_c{c}"] for c in model["concurrencies"]},
               **{f"ratio_c{c}": p[f"ratio_c{c}"] for c in model["concurrencies"]},
               "cpu_at": top, "cpu_us": p[f"cpu_us_c{top}"], "routed_share": p.get(f"routed_share_c{top}"),
               "cold_median_ms": (cold or {}).get("paths", {}).get(label, {}).get("median_ms")}
        rows.append(row)
    return rows


def summary_markdown(summary: dict) -> list[str]:
    rows, cs = summary["rows"], summary["concurrencies"]
    top = max(cs)
    lines = [f"Summary on {summary['model']} (CPU µs/req at c={top}):", "",
             "| path | p50 ms c=1 | p99 ms c=1 | REST p50 ms |" + "".join(f" req/s c={c} | ratio c={c} |" for c in cs)
             + " Python CPU | HAProxy CPU | other proxy CPU | node CPU | cold median ms |",
             "|" + "---|" * (9 + 2 * len(cs))]
    for r in rows:
        lines.append(f"| {r['path']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {_f(r['rest_p50_ms'])} |"
                     + "".join(f" {r[f'rps_c{c}']:.0f} | {r[f'ratio_c{c}']:.2f} |" for c in cs)
                     + f" {_groups(r['cpu_us'])} | {_f(r['cold_median_ms'], '.1f')} |")
    lines += [f"\nShare of requests HAProxy routed itself at c={top} (the rest took the slow path): "
              f"{r['path']} {r['routed_share']:.3f}" for r in rows if r["routed_share"] is not None]
    lines += ["", "| goal (issue 31) | path | verdict | measured |", "|---|---|---|---|"]
    for g in summary["goals"]:
        lines.append(f"| {g['goal']} | {g['path']} | {g['verdict']} | {g.get('detail', '')} |")
    for label, why in summary.get("skipped", {}).items():
        lines.append(f"\nskipped: {label}: {why}")
    return lines


def summarize(models: list[dict], tiny: str, rest: dict | None, cold: dict | None,
              skipped: dict[str, str]) -> dict:
    """The summary the scripts print last and put in their JSON under ``summary``."""
    model = next(m for m in models if m["model"] == tiny)
    return {"model": tiny, "concurrencies": model["concurrencies"],
            "rows": summary_rows(models, tiny, rest, cold),
            "goals": judge(models, tiny, rest, cold, skipped), "skipped": skipped}


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


def main() -> int:
    parser = argparse.ArgumentParser(description="the naive grpc.aio byte hop (started by start_hop)")
    parser.add_argument("--naive-hop", required=True, help="the target it forwards to")
    parser.add_argument("--listen", required=True, help="where it listens (unix:PATH or host:port)")
    parser.add_argument("--ports-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_naive_hop(args.naive_hop, args.listen, args.ports_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
