"""Start a real NVIDIA Triton (``tritonserver``) for integration tests.

    from support.triton import start_triton

    with start_triton(tmp_path, repository) as triton:
        client = tritonclient.grpc.InferenceServerClient(triton.grpc_target)

Each server gets its own directory ``tmp_path/triton-*`` with its log (``triton.log``: stdout
and stderr). Its command line is ``tfscache.tritonbin.command``'s: explicit model control,
no start-up models, bound to 127.0.0.1; ``extra`` flags come last and so win. Triton cannot
report a port it picked, so the ports are chosen free just before (bind, read, close: the
accepted race, as ``tfscache.supervisor.free_port``). ``start_triton`` returns once
``GET /v2/health/live`` answers 200; if the process exits first, or ``timeout`` passes, it
raises ``TritonStartError`` with the log.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from support.process import ServerProcess

from tfscache import tritonbin
from tfscache.supervisor import free_port


class TritonStartError(RuntimeError):
    """Triton exited (or timed out) before ``/v2/health/live`` answered 200."""

    def __init__(self, message: str, returncode: int | None, log: str) -> None:
        super().__init__(f"{message}\n--- tritonserver log ---\n{log[-8000:]}")
        self.returncode = returncode
        self.log = log


class TritonProcess(ServerProcess):
    """A running ``tritonserver``; a context manager that stops it (SIGTERM, then SIGKILL).

    ``grpc_target`` ("127.0.0.1:N") and ``rest_url``/``http_url`` ("http://127.0.0.1:M")
    as for the other servers; ``http_target`` ("127.0.0.1:M", what tritonclient.http takes),
    ``metrics_url``, ``repository``, ``argv``, ``pid``.
    """

    def __init__(self, process: subprocess.Popen, directory: Path, log_path: Path,
                 repository: Path, ports: dict, argv: list[str]) -> None:
        super().__init__(process, directory, log_path, ports)
        self.repository = repository
        self.metrics_port: int = ports["metrics"]
        self.argv = argv

    @property
    def http_port(self) -> int:
        return self.rest_port

    @property
    def http_url(self) -> str:
        return self.rest_url

    @property
    def http_target(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def start_triton(tmp_path: Path, repository: Path, *, extra: Iterable[str] = (),
                 timeout: float = 60.0, ports: dict[str, int] | None = None) -> TritonProcess:
    """Start ``tritonserver`` over ``repository`` and wait until it is live.

    ``ports`` ({"grpc", "rest", "metrics"}): the ports to listen on (a restart on the same
    address); default: free ones.
    """
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="triton-", dir=tmp_path))
    log_path = directory / "triton.log"
    ports = ({k: ports[k] for k in ("grpc", "rest", "metrics")} if ports
             else {"grpc": free_port(), "rest": free_port(), "metrics": free_port()})
    binary = tritonbin.find_tritonserver()
    argv, env = tritonbin.command(binary, Path(repository), http_port=ports["rest"],
                                  grpc_port=ports["grpc"], metrics_port=ports["metrics"],
                                  extra=extra)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=directory, env=env)
    ports["pid"] = process.pid
    triton = TritonProcess(process, directory, log_path, Path(repository), ports, argv)
    try:
        _wait_live(triton, timeout)
    except BaseException:
        triton.kill()
        raise
    return triton


def _wait_live(triton: TritonProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"{triton.http_url}/v2/health/live"
    while True:
        if triton.process.poll() is not None:
            raise TritonStartError(f"tritonserver exited with {triton.process.returncode} "
                                   "before it was live", triton.process.returncode, triton.log_text())
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise TritonStartError(f"tritonserver was not live within {timeout} s", None,
                                   triton.log_text())
        time.sleep(0.05)  # polling a condition with a deadline
