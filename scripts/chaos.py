#!/usr/bin/env python
"""Soak and chaos: churn over more models than fit while nodes and sidecars are SIGKILLed.

    .venv/bin/python scripts/chaos.py [--scenario embedded|sidecar|both] [--duration 60]
        [--clients 16] [--models 20] [--cap 4] [--kill-every 15] [--json out.json]

Builds ``addk_1 .. addk_M`` (y = x + K) with scripts/make_models.py into a temporary
repository (or reuses ``--repo``), then runs each scenario for ``--duration`` seconds:

* **embedded**: ``tfscache serve --local-nodes 2 --max-models-per-node C``; every
  ``--kill-every`` seconds node0, node1, node0, ... gets SIGKILL (pid from
  ``<state_dir>/nodeI.ports.json``); serve's supervisor restarts it.
* **sidecar**: a ``tfscache node`` and a ``tfscache serve --node-address`` sidecar, both on
  fixed free ports (clients keep their target); every ``--kill-every`` seconds the node,
  then the sidecar, alternately, gets SIGKILL and is started again at once with the same
  arguments (the sidecar with the same state directory).

Meanwhile ``--clients`` threads, each with its own channel and the official
``tensorflow_serving.apis`` stubs, send Predict (deadline 30 s, ``wait_for_ready``) for a
model chosen Zipf(``--alpha``) or uniformly, x a random float, and check every answer is
exactly float32(x) + K. A thread reads the serve's ``/status`` every 100 ms for the peak
resident count per node.

Reported (stdout; ``--json FILE``): requests, ok, errors by gRPC code with an example
message, wrong answers, p50/p99 latency, peak available and peak loading + available
per node against the cap, and the kills and restarts with their times. A request in
flight on a sidecar at the moment that sidecar is SIGKILLed dies with it (the client's
own connection is cut; TF Serving itself behaves so): those UNAVAILABLE errors (started
before the kill, or up to 0.25 s after the process was reaped, and ended after the kill)
are counted apart, as ``lost_with_killed_frontend``. Exit status 0 only when every other
request succeeded with the right answer. The working directory (logs: serve.log,
node.log) is kept when a scenario fails (or with ``--keep``), and named in the report.

Only 127.0.0.1. Every process the script starts is stopped on exit (SIGTERM, then SIGKILL);
ports for the sidecar scenario are picked free by binding port 0 (a small race, accepted
in a script; the tests never do this).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
DEADLINE_S = 30.0
LOST_GRACE_S = 0.25  # after a killed front end is reaped, before a client's connection sees it
EMPTY_CONFIG = "model_config_list {\n}\n"
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]


def launch(command: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_ports(process: subprocess.Popen, ports_file: Path, timeout: float = 180.0) -> dict:
    """The ports file's JSON once written; raises if the process exits or the time passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(ports_file.read_text())
        except (OSError, ValueError):
            pass
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(process.args[2:4])} exited with {process.returncode} before serving")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{' '.join(process.args[2:4])} did not serve within {timeout} s")
        time.sleep(0.05)


def stop(processes: list[subprocess.Popen], grace: float = 30.0) -> None:
    """SIGTERM each running process, SIGKILL what is left after ``grace`` seconds."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_node_pid(pid: int) -> bool:
    """SIGKILL ``pid`` if it is still a ``tfscache node`` (guards against pid reuse)."""
    try:
        process = psutil.Process(pid)
        if process.name() != "tfscache-node" and "node" not in process.cmdline():  # forked, or exec'd
            return False
        os.kill(pid, signal.SIGKILL)
        return True
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ensure_models(repo: Path, count: int) -> None:
    """addk_1 .. addk_count in ``repo``, built by scripts/make_models.py where missing."""
    if all((repo / f"addk_{k}" / "1" / "saved_model.pb").exists() for k in range(1, count + 1)):
        return
    started = time.monotonic()
    subprocess.run([PYTHON, str(REPO / "scripts" / "make_models.py"), str(repo), "--synthetic", str(count),
                    "--no-test-models"], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    print(f"built addk_1..addk_{count} in {repo} ({time.monotonic() - started:.1f} s)", file=sys.stderr)


@dataclass
class Results:
    """What the clients, the sampler and the chaos loop record; one lock for all of it."""

    t0: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    ok: int = 0
    latencies: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # (start, end, code, model, message)
    wrong: list = field(default_factory=list)   # (t, model, x, expected, got)
    events: list = field(default_factory=list)  # (t, text)
    frontend_kills: list = field(default_factory=list)  # (signalled, reaped) per SIGKILL of the target
    peaks: dict = field(default_factory=dict)   # node -> {cap, available, loading+available, ...}
    status_failures: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append((round(self.now(), 2), text))
        print(f"  t={self.now():6.2f} s  {text}", file=sys.stderr)


def model_weights(models: int, alpha: float) -> list[float]:
    """Cumulative weights: Zipf(alpha) by rank (addk_1 the most popular); alpha 0 = uniform."""
    weights = np.cumsum([1.0 / (k ** alpha) for k in range(1, models + 1)])
    return list(weights / weights[-1])


def client(target: str, results: Results, stop_at: float, cum_weights: list[float], seed: int) -> None:
    import grpc
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    rng = random.Random(seed)
    models = range(1, len(cum_weights) + 1)
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        while time.monotonic() < stop_at:
            k = rng.choices(models, cum_weights=cum_weights)[0]
            x = np.float32(rng.uniform(-1000.0, 1000.0))
            request = predict_pb2.PredictRequest()
            request.model_spec.name = f"addk_{k}"
            request.inputs["x"].CopyFrom(tensor_pb2.TensorProto(
                dtype=types_pb2.DT_FLOAT, float_val=[float(x)], tensor_shape={"dim": [{"size": 1}]}))
            start = time.monotonic()
            try:
                response = stub.Predict(request, timeout=DEADLINE_S, wait_for_ready=True)
            except grpc.RpcError as exc:
                with results.lock:
                    results.requests += 1
                    results.errors.append((start - results.t0, results.now(), exc.code().name, f"addk_{k}",
                                           str(exc.details())))
                continue
            check(results, k, x, response, start - results.t0, time.monotonic() - start)


def check(results: Results, k: int, x: np.float32, response, start: float, elapsed: float) -> None:
    expected = np.float32(x) + np.float32(k)
    y = response.outputs["y"]
    got = (list(np.frombuffer(y.tensor_content, dtype=np.float32)) if y.tensor_content
           else list(y.float_val))
    with results.lock:
        results.requests += 1
        if got == [expected]:
            results.ok += 1
            results.latencies.append(elapsed)
        else:
            results.wrong.append((round(start, 3), f"addk_{k}", float(x), float(expected), [float(v) for v in got]))


def sample_status(metrics_port: int, results: Results, stop: threading.Event) -> None:
    """Every 100 ms: the peak count per node of available, and of loading + available, versions."""
    url = f"http://127.0.0.1:{metrics_port}/status"
    while not stop.wait(0.1):
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                document = json.load(reply)
        except (OSError, ValueError):
            results.status_failures += 1  # the sidecar is down (or restarting)
            continue
        with results.lock:
            for node in document.get("nodes", []):
                if node.get("kind") == "node":
                    _peak(results.peaks.setdefault(node["name"], {}), node)


def _peak(peak: dict, node: dict) -> None:
    states = node["model_states"]
    available, loading = states["available"]["models"], states["loading"]["models"]
    for key, value in (("available", available), ("loading+available", loading + available),
                       ("unloading", states["unloading"]["models"])):
        peak[key] = max(peak.get(key, 0), value)
    peak["samples"] = peak.get("samples", 0) + 1
    if node.get("caps"):
        peak["cap"] = node["caps"]["max_models"]


class Embedded:
    """``tfscache serve --local-nodes 2``; kills node0, node1, node0, ... (serve restarts them)."""

    name = "embedded"

    def __init__(self, args, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.state_dir = workdir / "state"
        self.processes: list[subprocess.Popen] = []
        self.kills = 0
        self.pending: dict[str, int] = {}  # node -> killed pid, until a new pid serves

    def start(self) -> tuple[str, int]:
        ports_file = self.workdir / "serve.ports.json"
        serve = launch([PYTHON, "-m", "tfscache", "serve", "--model-repository", str(self.args.repo),
                        "--local-nodes", "2", "--max-models-per-node", str(self.args.cap),
                        "--grpc-port", "0", "--rest-port", "0", "--bind-address", "127.0.0.1",
                        "--ports-file", str(ports_file), "--metrics-port", "0", "--admin-port", "0",
                        "--set", f"node.state_dir={self.state_dir}"], self.workdir / "serve.log")
        self.processes.append(serve)
        ports = wait_ports(serve, ports_file)
        return f"127.0.0.1:{ports['grpc']}", ports["metrics"]

    def chaos(self, results: Results) -> None:
        node = f"node{self.kills % 2}"
        if node in self.pending:
            results.event(f"{node} not back yet: kill skipped")
            return
        pid = read_json(self.state_dir / f"{node}.ports.json").get("pid")
        if pid and kill_node_pid(pid):
            self.kills += 1
            self.pending[node] = pid
            results.event(f"SIGKILL {node} (pid {pid})")

    def poll(self, results: Results) -> None:
        for node, old in list(self.pending.items()):
            pid = read_json(self.state_dir / f"{node}.ports.json").get("pid")
            if pid and pid != old:
                del self.pending[node]
                results.event(f"{node} back: restarted by serve as pid {pid}")

    def stop(self) -> None:
        node_pids = [read_json(self.state_dir / f"node{i}.ports.json").get("pid") for i in range(2)]
        stop(self.processes)
        for pid in node_pids:  # serve stops its nodes; make sure
            if pid and kill_node_pid(pid):
                print(f"node pid {pid} outlived serve; killed", file=sys.stderr)


class Sidecar:
    """A ``tfscache node`` and a ``tfscache serve --node-address`` sidecar, both on fixed
    ports; kills the node, then the sidecar, alternately, and restarts each at once."""

    name = "sidecar"

    def __init__(self, args, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.ports = {name: free_port() for name in ("node_grpc", "node_rest", "grpc", "rest", "metrics")}
        (workdir / "node.config").write_text(EMPTY_CONFIG)
        self.running: dict[str, subprocess.Popen] = {}  # "node", "sidecar" -> the current process
        self.started: list[subprocess.Popen] = []
        self.pending: dict[str, Path] = {}  # who -> its ports file, until it serves again
        self.kills = 0

    def _command(self, who: str, ports_file: Path) -> list[str]:
        p, w = self.ports, self.workdir
        if who == "node":
            return [PYTHON, "-m", "tfscache", "node", f"--port={p['node_grpc']}", f"--rest_api_port={p['node_rest']}",
                    "--bind_address=127.0.0.1", f"--model_config_file={w / 'node.config'}",
                    "--file_system_poll_wait_seconds=0.1", f"--ports_file={ports_file}"]
        return [PYTHON, "-m", "tfscache", "serve", "--model-repository", str(self.args.repo),
                "--node-address", f"127.0.0.1:{p['node_grpc']},{p['node_rest']}",
                "--max-models-per-node", str(self.args.cap), "--bind-address", "127.0.0.1",
                "--grpc-port", str(p["grpc"]), "--rest-port", str(p["rest"]), "--metrics-port", str(p["metrics"]),
                "--admin-port", "-1", "--ports-file", str(ports_file), "--set", f"node.state_dir={w / 'sidecar-state'}"]

    def _start(self, who: str) -> Path:
        ports_file = self.workdir / f"{who}.{len(self.started)}.ports.json"
        log = self.workdir / ("node.log" if who == "node" else "serve.log")
        self.running[who] = launch(self._command(who, ports_file), log)
        self.started.append(self.running[who])
        return ports_file

    def start(self) -> tuple[str, int]:
        for who in ("node", "sidecar"):
            ports_file = self._start(who)
            wait_ports(self.running[who], ports_file)
        return f"127.0.0.1:{self.ports['grpc']}", self.ports["metrics"]

    def chaos(self, results: Results) -> None:
        who = ("node", "sidecar")[self.kills % 2]
        if who in self.pending:
            results.event(f"{who} not back yet: kill skipped")
            return
        process, killed_at = self.running[who], results.now()
        process.kill()
        process.wait()
        self.kills += 1
        if who == "sidecar":
            with results.lock:
                results.frontend_kills.append((killed_at, results.now()))
        results.event(f"SIGKILL {who} (pid {process.pid}); starting it again on the same ports")
        self.pending[who] = self._start(who)

    def poll(self, results: Results) -> None:
        for who, ports_file in list(self.pending.items()):
            process = self.running[who]
            if ports_file.exists():
                del self.pending[who]
                results.event(f"{who} back: serving as pid {process.pid}")
            elif process.poll() is not None:
                del self.pending[who]
                results.event(f"{who} restart FAILED: exited with {process.returncode}")

    def stop(self) -> None:
        stop(sorted(self.started, key=lambda p: p is not self.running.get("sidecar")))  # sidecar first


SCENARIOS = {"embedded": Embedded, "sidecar": Sidecar}


def run_scenario(kind, args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{kind.name}-"))
    scenario = kind(args, workdir)
    print(f"scenario {kind.name}: working directory {workdir}", file=sys.stderr)
    try:
        target, metrics_port = scenario.start()
        results = Results(t0=time.monotonic())
        results.event(f"serving on {target}; {args.clients} clients for {args.duration} s")
        drive(scenario, results, target, metrics_port, args)
    finally:
        scenario.stop()
    report = summarize(kind.name, results, args)
    if report["failed"] or args.keep:
        report["workdir_kept"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def drive(scenario, results: Results, target: str, metrics_port: int, args) -> None:
    """Clients and sampler for ``--duration`` s; the chaos loop in this thread meanwhile."""
    stop_at = results.t0 + args.duration
    cum = model_weights(args.models, 0.0 if args.uniform else args.alpha)
    sampling = threading.Event()
    threads = [threading.Thread(target=sample_status, args=(metrics_port, results, sampling), daemon=True)]
    threads += [threading.Thread(target=client, args=(target, results, stop_at, cum, args.seed * 1000 + i),
                                 daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    next_kill = results.t0 + args.kill_every if args.kill_every > 0 else float("inf")
    while time.monotonic() < stop_at:
        if time.monotonic() >= next_kill and time.monotonic() < stop_at - 1:
            scenario.chaos(results)
            next_kill += args.kill_every
        scenario.poll(results)
        time.sleep(0.05)
    for thread in threads[1:]:  # in-flight requests finish within their deadline
        thread.join(DEADLINE_S + 5)
    scenario.poll(results)
    sampling.set()
    threads[0].join(5)
    results.event(f"clients done ({sum(t.is_alive() for t in threads[1:])} still running)")


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def _lost_with_frontend(error: tuple, kills: list[tuple[float, float]]) -> bool:
    """UNAVAILABLE, started before the client's own front end was SIGKILLed (or up to
    LOST_GRACE_S after it was reaped, before the client's connection saw the close) and
    ended after the kill."""
    start, end, code = error[:3]
    return code == "UNAVAILABLE" and any(start <= reaped + LOST_GRACE_S and end >= killed
                                         for killed, reaped in kills)


def summarize(name: str, results: Results, args) -> dict:
    lost, errors = [], []
    for error in results.errors:
        (lost if _lost_with_frontend(error, results.frontend_kills) else errors).append(error)
    by_code: dict[str, dict] = {}
    for start, end, code, model, message in errors:
        entry = by_code.setdefault(code, {"count": 0, "example": message, "model": model,
                                          "first_t": round(start, 2), "times": []})
        entry["count"] += 1
        if len(entry["times"]) < 50:
            entry["times"].append([round(start, 2), round(end, 2)])
    lat = [v * 1e3 for v in results.latencies]
    return {"scenario": name, "duration_s": args.duration, "clients": args.clients, "models": args.models,
            "distribution": "uniform" if args.uniform else f"zipf({args.alpha})", "cap": args.cap,
            "kill_every_s": args.kill_every, "requests": results.requests, "ok": results.ok,
            "errors": len(errors), "errors_by_code": by_code, "lost_with_killed_frontend": len(lost),
            "lost_examples": [{"t": round(e[0], 2), "code": e[2], "message": e[4]} for e in lost[:5]],
            "lost_times": [[round(e[0], 3), round(e[1], 3)] for e in lost[:100]],
            "frontend_kills": [[round(k, 3), round(r, 3)] for k, r in results.frontend_kills],
            "wrong_answers": len(results.wrong), "wrong_examples": results.wrong[:10],
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": max(lat, default=None),
            "peaks": results.peaks, "status_sample_failures": results.status_failures,
            "events": results.events, "failed": bool(errors or results.wrong or results.requests == 0)}


def print_report(report: dict) -> None:
    r = report
    ms = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"\n== {r['scenario']}: {r['duration_s']} s, {r['clients']} clients, {r['models']} models "
          f"({r['distribution']}), cap {r['cap']} per node, a kill every {r['kill_every_s']} s")
    print(f"requests {r['requests']}  ok {r['ok']}  errors {r['errors']}  wrong answers {r['wrong_answers']}  "
          f"lost with a killed front end {r['lost_with_killed_frontend']}  "
          f"p50 {ms(r['p50_ms'])} ms  p99 {ms(r['p99_ms'])} ms  max {ms(r['max_ms'])} ms")
    for code, e in sorted(r["errors_by_code"].items()):
        print(f"  {code}: {e['count']} (first at t={e['first_t']} s, {e['model']}): {e['example'][:300]}")
    for e in r["lost_examples"]:
        print(f"  lost at t={e['t']} s: {e['code']}: {e['message'][:200]}")
    for w in r["wrong_examples"]:
        print(f"  wrong: t={w[0]} s {w[1]} x={w[2]} expected {w[3]} got {w[4]}")
    print("node    cap  peak available  peak loading+available  peak unloading  samples")
    for node, p in sorted(r["peaks"].items()):
        over = "  OVER THE CAP" if p.get("loading+available", 0) > (p.get("cap") or float("inf")) else ""
        print(f"{node:<7} {p.get('cap', '-')!s:<4} {p.get('available', 0):<15} "
              f"{p.get('loading+available', 0):<23} {p.get('unloading', 0):<15} {p.get('samples', 0)}{over}")
    print("events:")
    for t, text in r["events"]:
        print(f"  t={t:7.2f} s  {text}")
    if "workdir_kept" in r:
        print(f"logs kept in {r['workdir_kept']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["embedded", "sidecar", "both"], default="both")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic per scenario")
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--models", type=int, default=20, help="addk models to spread requests over")
    parser.add_argument("--cap", type=int, default=4, help="--max-models-per-node")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between kills (0: none)")
    parser.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent of the model choice")
    parser.add_argument("--uniform", action="store_true", help="choose models uniformly instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repo", type=Path, help="model repository to build into or reuse")
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the working directories (logs) on success too")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop what we started
    nodes = 2 if args.scenario != "sidecar" else 1
    if args.models <= nodes * args.cap:
        parser.error(f"--models {args.models} fit in {nodes} node(s) x --cap {args.cap}: no churn")
    built = None
    if args.repo is None:
        built = args.repo = Path(tempfile.mkdtemp(prefix="chaos-models-"))
    try:
        ensure_models(args.repo, args.models)
        from tensorflow_serving.apis import prediction_service_pb2_grpc  # noqa: F401  once, before the threads
        names = ["embedded", "sidecar"] if args.scenario == "both" else [args.scenario]
        reports = [run_scenario(SCENARIOS[name], args) for name in names]
    finally:
        if built is not None:
            shutil.rmtree(built, ignore_errors=True)
    for report in reports:
        print_report(report)
    if args.json:
        args.json.write_text(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                         "cpus": os.cpu_count(),
                                         "argv": sys.argv, "reports": reports}, indent=1) + "\n")
    return 1 if any(r["failed"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
