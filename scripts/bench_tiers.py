#!/usr/bin/env python
"""A request for a demoted model against a cold load of the same model (issue 32's live goal).

    .venv/bin/python scripts/bench_tiers.py [--rounds 12] [--size-mb 40] [--json F]

Two `tfscache serve` processes, one after the other in the same run, over the same synthetic
SavedModels (scripts/make_models.py --synthetic, each --size-mb of weights), each GPU-tier node
holding one model at a time (--max-models-per-node 1):

* **drop** (baseline): one node, `cache.demote = none`, what tfscache does without a host
  tier. Each round requests a model that is on no node: a cold load (its victim is unloaded);
  then the same model again: a warm hit;
* **host tier**: one GPU-tier node and one host-tier node (--local-host-nodes 1),
  `cache.demote = host`. Each round requests a model on no node (a cold load, and the hand-off
  of the node's victim to the host tier before it: its figure includes that), then the
  model demoted just before, which the host tier answers.

Every request is a REST predict through the front end, timed at the client. The figures are
the medians and maxima of the rounds; the ratio to read is the drop serve's cold load over the
host tier's answer for a demoted model (the goal: at least 5). This machine has no GPU: both
tiers run on the CPU here, so the host tier's answer costs what a warm request costs; on a GPU
machine its service time is the CPU's. Prints Markdown for docs/BENCHMARKS.md. Loopback only;
every process it starts is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchlib.report import machine  # scripts/ is the script's own directory

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable


def predict(rest_port: int, name: str) -> float:
    """Seconds one REST predict of ``name`` took; raises unless it answered 200 with y = x + k."""
    body = b'{"instances": [1.0]}'
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/{name}:predict",
                                     data=body, method="POST")
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as reply:
        answer = json.loads(reply.read())
    seconds = time.perf_counter() - started
    k = int(name.rsplit("_", 1)[1])
    if answer != {"predictions": [1.0 + k]}:
        raise RuntimeError(f"{name} answered {answer}")
    return seconds


class Serve:
    """One `tfscache serve` on ports it chose (read from its ports file)."""

    def __init__(self, work: Path, models: Path, label: str, args: list[str]) -> None:
        self.work = work / label
        self.work.mkdir()
        ports = self.work / "ports.json"
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tfscache", "serve", "--model-repository", str(models),
             "--bind-address", "127.0.0.1", "--grpc-port", "0", "--rest-port", "0",
             "--max-models-per-node", "1", "--set", f"server.ports_file={ports}",
             "--set", f"node.state_dir={self.work / 'state'}", *args],
            stdout=open(self.work / "serve.log", "wb"), stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 180
        while not ports.exists() or not ports.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve {label} did not start: see {self.work / 'serve.log'}")
            time.sleep(0.05)  # polling a condition with a deadline
        self.rest = json.loads(ports.read_text())["rest"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


def drop_rounds(serve: Serve, names: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"cold": [], "warm": []}
    predict(serve.rest, names[0])  # the first load warms the node's code paths
    for name in names[1:]:
        out["cold"].append(predict(serve.rest, name))
        out["warm"].append(predict(serve.rest, name))
    return out


def host_rounds(serve: Serve, names: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"cold_and_hand_off": [], "demoted": []}
    predict(serve.rest, names[0])
    for before, name in zip(names, names[1:]):
        out["cold_and_hand_off"].append(predict(serve.rest, name))  # `before` goes to host0
        out["demoted"].append(predict(serve.rest, before))  # answered by host0
    return out


def run(rounds: int, size_mb: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as tmp:
        work = Path(tmp)
        models = work / "models"
        subprocess.run([PYTHON, "scripts/make_models.py", str(models), "--synthetic",
                        str(rounds + 1), "--size-mb", str(size_mb), "--no-test-models"],
                       cwd=REPO, check=True, capture_output=True)
        names = [f"addk_{i}" for i in range(1, rounds + 2)]
        results: dict = {"machine": machine(), "rounds": rounds, "size_mb": size_mb}
        serve = Serve(work, models, "drop", ["--local-nodes", "1"])
        try:
            results["drop"] = drop_rounds(serve, names)
        finally:
            serve.stop()
        # A horizon of a millisecond: no promotion by rate, so each demoted model stays on the
        # host tier for its measured request.
        serve = Serve(work, models, "host", ["--local-nodes", "1", "--local-host-nodes", "1",
                                             "--set", "cache.demote=host",
                                             "--set", "cache.promote_horizon_s=0.001"])
        try:
            results["host"] = host_rounds(serve, names)
        finally:
            serve.stop()
    return results


def markdown(r: dict) -> str:
    def row(label: str, times: list[float]) -> str:
        return f"| {label} | {1000 * statistics.median(times):.1f} ms | {1000 * max(times):.1f} ms |"

    cold, demoted = statistics.median(r["drop"]["cold"]), statistics.median(r["host"]["demoted"])
    return "\n".join([
        f"Machine: {r['machine']}; {r['rounds']} rounds, models of {r['size_mb']:g} MB.", "",
        "| request (REST predict, at the client) | median | max |", "|---|---|---|",
        row("drop serve: a cold load (baseline)", r["drop"]["cold"]),
        row("drop serve: the same model again (warm)", r["drop"]["warm"]),
        row("host tier: a cold load, its victim handed off first", r["host"]["cold_and_hand_off"]),
        row("host tier: the model demoted just before (host-tier answer)", r["host"]["demoted"]),
        "", f"Cold load over the demoted model's answer, medians: {cold / demoted:.1f}x.",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--size-mb", type=float, default=40.0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    results = run(args.rounds, args.size_mb)
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
