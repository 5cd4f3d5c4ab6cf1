"""Helpers shared by the tests of the Open Inference Protocol kinds (tests/triton, tests/mlserver,
tests/oip).

    with client_pairs(serve, raw) as clients:   # {"tfs": (grpc, http), "raw": (grpc, http)}
        ...
    tree_rss(pid)                               # RSS of a process and everything under it
    class IndexSampler(NodeSampler): ...        # a kind's sampler of its nodes' own index
    wait_live(server, 60, "mlserver", failed)   # /v2/health/live answers 200
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from support.process import ServerProcess


@contextmanager
def client_pairs(serve, raw) -> Iterator[dict[str, tuple]]:
    """gRPC and HTTP tritonclient clients of tfscache ("tfs") and of the raw server ("raw")."""
    import tritonclient.grpc as tritongrpc
    import tritonclient.http as tritonhttp

    made = {"tfs": (tritongrpc.InferenceServerClient(serve.grpc_target),
                    tritonhttp.InferenceServerClient(f"127.0.0.1:{serve.rest_port}", network_timeout=120)),
            "raw": (tritongrpc.InferenceServerClient(raw.grpc_target),
                    tritonhttp.InferenceServerClient(raw.http_target, network_timeout=120))}
    try:
        yield made
    finally:
        for grpc_client, http_client in made.values():
            grpc_client.close()
            http_client.close()


def tree_rss(pid: int) -> int:
    """RSS of process ``pid`` plus all its descendants (a process that exits meanwhile counts 0)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for process in (root, *root.children(recursive=True)):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class OipServerProcess(ServerProcess):
    """A running OIP server: ``http_url`` (its REST URL) and ``http_target`` ("127.0.0.1:M",
    what tritonclient.http takes) besides ServerProcess's ``grpc_target`` and ``rest_url``."""

    @property
    def http_url(self) -> str:
        return self.rest_url

    @property
    def http_target(self) -> str:
        return f"127.0.0.1:{self.rest_port}"


def wait_live(server, timeout: float, program: str, failed: Callable[[str, int | None], Exception],
              interval: float = 0.05) -> None:
    """Poll ``server``'s ``/v2/health/live`` (``http_url``) until it answers 200; raises
    ``failed(message, returncode)`` when its process (``process``) exits first or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    url = f"{server.http_url}/v2/health/live"
    while True:
        if server.process.poll() is not None:
            code = server.process.returncode
            raise failed(f"{program} exited with {code} before it was live", code)
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise failed(f"{program} was not live within {timeout} s", None)
        time.sleep(interval)  # polling a condition with a deadline


class NodeSampler:
    """Samples nodes' own repository index in a background thread until stopped; a kind's
    sampler (support.triton, support.mlserver) says in ``_run`` how its index is read.

    ``nodes`` is {node name: address}, or a callable returning it (a restarted node has new
    ports); ``samples`` is {node name: [the models resident at each sample]}; a node that does not
    answer is counted in ``errors``.
    """

    def __init__(self, nodes) -> None:
        self._nodes = nodes if callable(nodes) else (lambda: nodes)
        self.samples: dict[str, list[set[str]]] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        raise NotImplementedError

    def peak(self, node: str) -> int:
        return max(map(len, self.samples.get(node, [])), default=0)

    def count(self) -> int:
        return sum(map(len, self.samples.values()))
