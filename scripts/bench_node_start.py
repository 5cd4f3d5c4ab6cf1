#!/usr/bin/env python
"""Node start: forked from the node template against exec'd (TensorFlow imported per process).

    .venv/bin/python scripts/bench_node_start.py [--repeats 5] [--nodes 4]

1. Start to serving: ``tfscache node`` with one model (half_plus_two) from the moment it is
   asked for until its ports file is written (it then serves gRPC and REST), exec'd as
   ``python -m tfscache node`` (the baseline) and forked from an already running template;
   ``--repeats`` each, alternating. The template's own start (TensorFlow's import) is one figure.
2. Restart: ``tfscache serve --local-nodes 1`` with ``node.fork_nodes`` false (baseline) and
   true; node0 SIGKILLed ``--repeats`` times; seconds from the kill until a REST predict through
   the front end answers again (the supervisor saw the exit, started the node, attached a new
   cache, loaded the model).
3. Memory: ``--nodes`` nodes with the same model, exec'd and then forked; the sum of their PSS
   (proportional set size: a page shared by k processes counts 1/k to each), template included.

Prints Markdown: medians and the ratio fork/exec. Loopback only; everything started is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import psutil  # noqa: E402
from support.serving import link_repository, start_serve  # noqa: E402
from support.node import PYTHON  # noqa: E402
from tfscache.modelserver import template  # noqa: E402
from support.models.tfserving import build_test_models  # noqa: E402


def node_argv(model: Path, ports: Path) -> list[str]:
    return ["node", "--port=0", "--rest_api_port=0", "--bind_address=127.0.0.1", f"--ports_file={ports}",
            "--model_name=half_plus_two", f"--model_base_path={model}"]


def wait_file(path: Path, alive) -> None:
    while not path.exists():
        if not alive():
            raise RuntimeError(f"the node exited before writing {path}")
        time.sleep(0.005)


def start(kind: str, socket_path: str, model: Path, work: Path, n: int):
    ports = work / f"{kind}-{n}.json"
    began = time.perf_counter()
    if kind == "exec":
        proc = subprocess.Popen([PYTHON, "-m", "tfscache", *node_argv(model, ports)], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        proc = template.Child(socket_path, node_argv(model, ports), output=os.devnull, cwd=str(REPO))
    wait_file(ports, lambda: proc.poll() is None)
    return proc, time.perf_counter() - began


def stop(proc) -> None:
    proc.terminate()
    proc.wait(60)


def pss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids)


def predict(rest_url: str, x: float) -> list[float]:
    request = urllib.request.Request(f"{rest_url}/v1/models/half_plus_two:predict",
                                     data=json.dumps({"instances": [x]}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["predictions"]


def restart_seconds(serve) -> float:
    old = serve.node_ports("node0")["pid"]
    predict(serve.rest_url, 1.0)  # resident before the kill
    began = time.perf_counter()
    os.kill(old, signal.SIGKILL)
    while serve.node_ports("node0").get("pid", old) == old:
        time.sleep(0.005)
    while True:
        try:
            if predict(serve.rest_url, 1.0) == [2.5]:
                return time.perf_counter() - began
        except OSError:
            time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-node-start-") as tmp:
        work = Path(tmp)
        build_test_models(work / "models")
        model = work / "models" / "half_plus_two"
        socket_path = str(work / "template.sock")
        began = time.perf_counter()
        owner = subprocess.Popen([PYTHON, "-m", "tfscache.modelserver.template", socket_path], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            template.wait_for_socket(socket_path, lambda: owner.poll() is None, 300)
            template_s = time.perf_counter() - began
            times: dict[str, list[float]] = {"exec": [], "fork": []}
            for n in range(args.repeats):
                for kind in ("exec", "fork"):
                    proc, seconds = start(kind, socket_path, model, work, n)
                    times[kind].append(seconds)
                    stop(proc)
            memory = {}
            for kind in ("exec", "fork"):
                procs = [start(kind, socket_path, model, work, 100 + i)[0] for i in range(args.nodes)]
                try:
                    memory[kind] = pss([p.pid for p in procs] + ([owner.pid] if kind == "fork" else []))
                finally:
                    for proc in procs:
                        stop(proc)
        finally:
            owner.terminate()
            owner.wait(60)
        repo = link_repository(work / "repo", [model])
        restarts: dict[str, list[float]] = {}
        for kind, fork in (("exec", "false"), ("fork", "true")):
            with start_serve(work / f"serve-{kind}", repo, "--local-nodes", "1", "--set",
                             f"node.fork_nodes={fork}") as serve:
                restarts[kind] = [restart_seconds(serve) for _ in range(args.repeats)]

    def row(what: str, values: dict[str, float], unit: str, fmt: str) -> str:
        return (f"| {what} | {values['exec']:{fmt}} {unit} | {values['fork']:{fmt}} {unit} | "
                f"{values['fork'] / values['exec']:.3f}x |")

    print(f"{args.repeats} repeats, {args.nodes} nodes for memory; {os.cpu_count()} CPUs\n")
    print("| figure | exec'd (baseline) | forked from the template | fork/exec |")
    print("|---|---|---|---|")
    print(row("start to serving, median", {k: statistics.median(v) for k, v in times.items()}, "s", ".3f"))
    print(row("kill to served again through serve, median", {k: statistics.median(v) for k, v in restarts.items()},
              "s", ".3f"))
    print(row(f"PSS of {args.nodes} nodes (+ template)", {k: v / 2**20 for k, v in memory.items()}, "MiB", ".0f"))
    print(f"\nthe template's own start (TensorFlow's import): {template_s:.2f} s")


if __name__ == "__main__":
    main()
