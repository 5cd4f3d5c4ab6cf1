"""Start real ``tfscache serve`` processes and build model repositories for front-end tests.

    with start_serve(tmp_path, repo, "--local-nodes", "2") as serve:
        stub = PredictionServiceStub(grpc.insecure_channel(serve.grpc_target))

Serve binds 127.0.0.1 on port 0 and reports its ports in ``--ports-file``; its node
state (the nodes' ports files) lives in ``serve.state_dir``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from support.node import PYTHON, REPO

_counter = itertools.count(1)


class ServeStartError(RuntimeError):
    pass


class ServeProcess:
    """A running ``tfscache serve``; a context manager that stops it (SIGTERM) on exit."""

    def __init__(self, process: subprocess.Popen, directory: Path, ports: dict) -> None:
        self.process = process
        self.directory = directory
        self.log_path = directory / "serve.log"
        self.state_dir = directory / "state"
        self.grpc_port: int = ports["grpc"]
        self.rest_port: int = ports["rest"]
        self.pid: int = ports["pid"]

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def node_ports(self, name: str) -> dict:
        """The ports file of local node ``name`` (node0, node1, ...): grpc, rest, pid.

        ``{}`` while the node restarts (its old file is gone, the new one not yet written).
        """
        try:
            return json.loads((self.state_dir / f"{name}.ports.json").read_text())
        except FileNotFoundError:
            return {}

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout: float = 60.0, *, count: int = 1) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            matches = list(re.finditer(pattern, self.log_text(), re.MULTILINE))
            if len(matches) >= count:
                return matches[count - 1]
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"serve log never matched {pattern!r} x{count}\n{self.log_text()[-4000:]}")
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def serve_command(args) -> list[str]:
    return [PYTHON, "-m", "tfscache", "serve", *args]


def start_serve(tmp_path: Path, repository: Path, *args: str, timeout: float = 180.0,
                env: dict[str, str] | None = None) -> ServeProcess:
    """Start ``tfscache serve`` over ``repository`` and wait until both front ends serve."""
    directory = Path(tmp_path) / f"serve-{next(_counter)}"
    directory.mkdir(parents=True)
    ports_file = directory / "ports.json"
    command = serve_command(["--model-repository", str(repository), "--grpc-port", "0", "--rest-port", "0",
                             "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                             "--set", f"node.state_dir={directory / 'state'}", *args])
    with open(directory / "serve.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    deadline = time.monotonic() + timeout
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise ServeStartError(f"tfscache serve did not start (rc={process.returncode}):\n"
                                  f"{(directory / 'serve.log').read_text(errors='replace')[-6000:]}")
        time.sleep(0.05)
    return ServeProcess(process, directory, json.loads(ports_file.read_text()))


def link_repository(root: Path, bases) -> Path:
    """A model repository whose entries are symlinks to already built model directories."""
    root.mkdir(parents=True, exist_ok=True)
    for base in bases:
        base = Path(base)
        (root / base.name).symlink_to(base, target_is_directory=True)
    return root
