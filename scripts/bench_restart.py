#!/usr/bin/env python
"""How soon a restarted sidecar serves again, with and without its node stuck in a load.

    .venv/bin/python scripts/bench_restart.py [--rounds 5] [--json F]

One `tfscache node` (with a load gate) and one `tfscache serve --node-address` sidecar in
front of it, on fixed ports. addk_1 is resident. Each round SIGKILLs the sidecar and starts
it again, and times from the new process's start to its first successful REST predict of
addk_1:

* baseline: nothing else going on;
* held: the node is inside a load of addk_2 that does not end (its gate file is held)
  while the sidecar is killed and restarted (issue 10: "serves other models within 2 s").

Prints Markdown; the figures go to docs/BENCHMARKS.md. Loopback only; every process it
starts is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable


def free_port() -> int:
    """A port free now (bind 0, read, close): the processes here must keep theirs across restarts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def predict(rest_port: int, name: str, timeout: float) -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/{name}:predict",
                                     data=b'{"instances": [1.0]}', method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)  # polling a condition with a deadline


class Sidecar:
    def __init__(self, work: Path, repo: Path, node: tuple[int, int]) -> None:
        self.work, self.repo, self.node = work, repo, node
        self.grpc, self.rest = free_port(), free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; the seconds until it answered a predict of addk_1."""
        started = time.monotonic()
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tfscache", "serve", "--model-repository", str(self.repo),
             "--node-address", f"127.0.0.1:{self.node[0]},{self.node[1]}", "--bind-address", "127.0.0.1",
             "--grpc-port", str(self.grpc), "--rest-port", str(self.rest),
             "--set", f"node.state_dir={self.work / 'state'}"],
            stdout=open(self.work / "serve.log", "ab"), stderr=subprocess.STDOUT, cwd=REPO)
        wait(lambda: predict(self.rest, "addk_1", 1.0), 120, "the sidecar to serve addk_1")
        return time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def run(rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        work = Path(tmp)
        subprocess.run([PYTHON, "scripts/make_models.py", str(work / "models"), "--synthetic", str(rounds + 2)],
                       cwd=REPO, check=True, capture_output=True)
        gate = work / "gate"
        gate.mkdir()
        (work / "empty.config").write_text("model_config_list {\n}\n")
        ports = free_port(), free_port()
        node = subprocess.Popen(
            [PYTHON, "-m", "tfscache", "node", f"--port={ports[0]}", f"--rest_api_port={ports[1]}",
             "--bind_address=127.0.0.1", f"--model_config_file={work / 'empty.config'}",
             "--file_system_poll_wait_seconds=0.1", "--num_load_threads=2", f"--load_gate_dir={gate}"],
            stdout=open(work / "node.log", "wb"), stderr=subprocess.STDOUT, cwd=REPO)
        sidecar = Sidecar(work, work / "models", ports)
        results: dict[str, list[float]] = {"baseline": [], "held": []}
        try:
            sidecar.start()  # loads addk_1 (and waits for the node to come up)
            for i in range(rounds):
                sidecar.kill()
                results["baseline"].append(sidecar.start())
                name = f"addk_{i + 2}"  # a model not loaded yet: its load is held at the gate
                hold = gate / f"{name}.hold"
                hold.touch()
                loader = threading.Thread(target=predict, args=(sidecar.rest, name, 120.0), daemon=True)
                loader.start()
                wait(lambda: (gate / f"{name}.1.waiting").exists(), 60, f"the node to start loading {name}")
                sidecar.kill()
                results["held"].append(sidecar.start())
                if not hold.exists():
                    raise RuntimeError("the held load ended during the measurement")
                hold.unlink()  # the load ends; the next round holds another model
        finally:
            sidecar.kill()
            node.send_signal(signal.SIGTERM)
            node.wait(30)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    results = run(args.rounds)
    print(f"Machine: {os.cpu_count()} cores, load average {load:.1f} at start; {args.rounds} rounds.\n")
    print("| sidecar restarted (SIGKILL) | median | max |\n|---|---|---|")
    for name, label in (("baseline", "nothing else going on (baseline)"),
                        ("held", "its node inside a load that never ends")):
        times = results[name]
        print(f"| {label} | {statistics.median(times):.2f} s | {max(times):.2f} s |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
