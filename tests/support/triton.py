"""Start a real NVIDIA Triton (``tritonserver``) for integration tests.

    from support.triton import start_triton

    with start_triton(tmp_path, repository) as triton:
        client = tritonclient.grpc.InferenceServerClient(triton.grpc_target)

Each server gets its own directory ``tmp_path/triton-*`` with its log (``triton.log``: stdout
and stderr). Its command line is ``tfscache.kinds.triton.launcher.command``'s: explicit model control,
no start-up models, bound to 127.0.0.1; ``extra`` flags come last and so win. Triton cannot
report a port it picked, so the ports are chosen free just before (bind, read, close: the
accepted race, as ``tfscache.kinds.supervisor.free_ports``). ``start_triton`` returns once
``GET /v2/health/live`` answers 200; if the process exits first, or ``timeout`` passes, it
raises ``TritonStartError`` with the log.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from support.oip import NodeSampler, OipServerProcess, wait_live
from support.process import ServerProcess, started_together
from support.traffic import ClientLoop

from tfscache.kinds.triton import launcher as tritonbin
from tfscache.kinds.supervisor import free_ports


class TritonStartError(RuntimeError):
    """Triton exited (or timed out) before ``/v2/health/live`` answered 200."""

    def __init__(self, message: str, returncode: int | None, log: str) -> None:
        super().__init__(f"{message}\n--- tritonserver log ---\n{log[-8000:]}")
        self.returncode = returncode
        self.log = log


class TritonProcess(OipServerProcess):
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

    def stop(self, timeout: float = 30.0) -> int:
        # On SIGTERM Triton waits up to --exit-timeout-secs (30 s) for every HTTP connection still
        # open. Sockets this process no longer uses can stay open in reference cycles until the
        # garbage collector runs (measured after a tritonclient.http call that raised: a 30 s
        # stop, 3 s with a collection first). Collect first.
        gc.collect()
        return super().stop(timeout)

    @property
    def http_port(self) -> int:
        return self.rest_port

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def beside_raw_triton(start: Callable[[], ServerProcess], directory: Path, repository: Path
                      ) -> contextlib.AbstractContextManager[list[ServerProcess]]:
    """``start()`` (a module's ``tfscache serve``, say) and a raw ``start_triton(directory,
    repository)`` to compare it with, started and stopped at once: ``[server, raw]``."""
    return started_together([start, functools.partial(start_triton, directory, repository)])


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
             else dict(zip(("grpc", "rest", "metrics"), free_ports(3))))
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
        wait_live(triton, timeout, "tritonserver",
                  lambda message, code: TritonStartError(message, code, triton.log_text()))
    except BaseException:
        triton.kill()
        raise
    return triton


# --- tfscache serve --backend triton: its children, their indexes, client traffic ---

RESIDENT_STATES = frozenset({"READY", "LOADING", "UNLOADING"})  # a model holds memory until Triton says it is gone
_NODE_SERVING = re.compile(r"(node\d+) serving: pid (\d+), gRPC (\d+), REST (\d+)")


def serve_triton_nodes(serve) -> dict[str, dict[str, int]]:
    """{"node0": {"pid", "grpc", "rest"}, ...} of a ``tfscache serve --backend triton``'s children.

    The supervisor writes no ports file for tritonserver children; it logs ``nodeI serving: pid
    P, gRPC G, REST R`` at each (re)start, and the last such line of each node wins.
    """
    nodes: dict[str, dict[str, int]] = {}
    for match in _NODE_SERVING.finditer(serve.log_text()):
        nodes[match.group(1)] = {"pid": int(match.group(2)), "grpc": int(match.group(3)),
                                 "rest": int(match.group(4))}
    return nodes


def index_states(grpc_target: str, timeout: float = 10.0) -> dict[str, set[str]]:
    """{model name: {state of each version}} from the node's own RepositoryIndex (one call)."""
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(grpc_target)
    try:
        index = client.get_model_repository_index(client_timeout=timeout)
    finally:
        client.close()
    states: dict[str, set[str]] = {}
    for model in index.models:
        states.setdefault(model.name, set()).add(model.state)
    return states


def resident_models(grpc_target: str, timeout: float = 10.0) -> set[str]:
    """The models a node holds (READY, LOADING or UNLOADING in its own index)."""
    return {name for name, states in index_states(grpc_target, timeout).items() if states & RESIDENT_STATES}


class IndexSampler(NodeSampler):
    """Samples each node's own RepositoryIndex in a background thread until stopped.

    One RepositoryIndex answer is one snapshot of the node's model states, so the number of
    resident models in it (READY + LOADING + UNLOADING) is what the node held at that instant.
    ``targets`` is {node name: gRPC target}, or a callable returning it (a restarted node has new
    ports); a sample of a node that does not answer is skipped and counted in ``errors``.
    """

    def _run(self) -> None:
        import tritonclient.grpc as tritongrpc

        clients: dict[str, object] = {}
        try:
            while not self._stop.is_set():
                for name, target in self._nodes().items():
                    client = clients.get(target)
                    if client is None:
                        client = clients[target] = tritongrpc.InferenceServerClient(target)
                    try:
                        index = client.get_model_repository_index(client_timeout=5.0)
                    except Exception:  # noqa: BLE001 - a node restarting: no sample
                        self.errors += 1
                        continue
                    self.samples.setdefault(name, []).append(
                        {m.name for m in index.models if m.state in RESIDENT_STATES})
                self._stop.wait(0.005)  # pacing: leave the cores to the traffic under test
        finally:
            for client in clients.values():
                client.close()


class OipTraffic(ClientLoop):
    """Client threads sending ModelInfer through the official tritonclient, in a loop until stopped.

    Every ``rest_every``-th client uses ``tritonclient.http`` (binary tensors), the rest
    ``tritonclient.grpc``; the loop, results and ``check()`` are ``support.traffic.ClientLoop``'s.
    """

    def __init__(self, grpc_target: str, http_target: str, models: list[str], clients: int = 16,
                 timeout: float = 120.0, rest_every: int = 4) -> None:
        from tritonclient.utils import InferenceServerException

        super().__init__(models, clients, timeout)
        self.grpc_target, self.http_target, self.rest_every = grpc_target, http_target, rest_every
        self.errors = (InferenceServerException, OSError)

    def client(self, worker: int) -> None:
        import numpy as np
        import tritonclient.grpc as tritongrpc
        import tritonclient.http as tritonhttp

        rest = self.rest_every and worker % self.rest_every == self.rest_every - 1
        if rest:
            client = tritonhttp.InferenceServerClient(self.http_target, connection_timeout=self.timeout,
                                                      network_timeout=self.timeout)
        else:
            client = tritongrpc.InferenceServerClient(self.grpc_target)
        module = tritonhttp if rest else tritongrpc

        def send(name: str, x: float) -> list[float]:
            tensor = module.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([x], dtype=np.float32), **({"binary_data": True} if rest else {}))
            if rest:
                return client.infer(name, [tensor]).as_numpy("y").tolist()
            return client.infer(name, [tensor], client_timeout=self.timeout).as_numpy("y").tolist()

        try:
            self.loop(worker, send)
        finally:
            client.close()


def oip_infer(grpc_target: str, name: str, x: float, timeout: float = 60.0) -> list[float]:
    """One ModelInfer of ``name`` with x = [x] through the official tritonclient.grpc; y as a list."""
    import numpy as np
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(grpc_target)
    tensor = tritongrpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    try:
        return client.infer(name, [tensor], client_timeout=timeout).as_numpy("y").tolist()
    finally:
        client.close()
