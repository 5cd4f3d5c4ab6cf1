"""What every launched test server has in common: a child process with a log file and a
ports file it writes once serving (`tfscache node --ports_file`, `tfscache serve --ports-file`).

    process = launch(command, directory, log_path)
    ports = wait_for_ports(process, ports_file, log_path, timeout, StartError)

    with started_together([lambda: start_serve(...), lambda: start_serve(...)]) as (a, b):
        ...   # the starts overlapped; both are stopped on exit
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

S = TypeVar("S")

REPO = Path(__file__).resolve().parents[2]


def launch(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` in the repository root, stdout and stderr into ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def wait_for_ports(process: subprocess.Popen, ports_file: Path, log_path: Path, timeout: float,
                   fail) -> dict:
    """The ports file's JSON once written; ``fail(message, returncode, log)`` if the process
    exits first or ``timeout`` passes (then the process is killed)."""
    deadline = time.monotonic() + timeout
    while not ports_file.exists():
        if process.poll() is not None:
            raise fail(f"{' '.join(process.args[1:4])} exited with {process.returncode} before serving",
                       process.returncode, log_path.read_text(errors="replace"))
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise fail(f"{' '.join(process.args[1:4])} did not serve within {timeout} s", None,
                       log_path.read_text(errors="replace"))
        time.sleep(0.05)  # polling a condition with a deadline
    return json.loads(ports_file.read_text())


@contextlib.contextmanager
def started_together(starts: list[Callable[[], S]]) -> Iterator[list[S]]:
    """Run each of ``starts`` (a call that starts a server and returns it, a context manager that
    stops it, once serving) at once: the starts overlap (each waits on its own process's imports,
    TensorFlow's above all) instead of queueing. The servers, in the order of ``starts``; every one
    that started is stopped on exit, and also when another failed to start; the stops overlap too
    (a tritonserver takes seconds to exit)."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    started = [f.result().__enter__() for f in futures if f.exception() is None]
    try:
        for future in futures:
            future.result()  # the first start that failed raises here; the others are stopped
        yield started
    finally:
        with ThreadPoolExecutor(max(len(started), 1)) as pool:
            stops = [pool.submit(server.__exit__, None, None, None) for server in started]
        for stop in stops:
            stop.result()


class ServerProcess:
    """A running server; a context manager that stops it (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, process: subprocess.Popen, directory: Path, log_path: Path, ports: dict) -> None:
        self.process = process
        self.directory = directory
        self.log_path = log_path
        self.grpc_port: int = ports["grpc"]
        self.rest_port: int = ports["rest"]
        self.pid: int = ports["pid"]

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout: float = 30.0, *, count: int = 1) -> re.Match:
        """Wait until the log matches ``pattern`` (a regex) at least ``count`` times."""
        deadline = time.monotonic() + timeout
        while True:
            matches = list(re.finditer(pattern, self.log_text(), re.MULTILINE))
            if len(matches) >= count:
                return matches[count - 1]
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"log never matched {pattern!r} x{count} (rc={self.process.poll()})\n"
                    f"{self.log_text()[-4000:]}")
            time.sleep(0.02)

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = 30.0) -> int:
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; kill if it does not exit. Returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> int:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pid={self.pid}, grpc={self.grpc_port}, rest={self.rest_port})"
