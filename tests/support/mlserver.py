"""Start a real MLServer (``mlserver start``) for integration tests.

    from support.mlserver import MLSERVER, start_mlserver

    with start_mlserver(tmp_path, repository) as node:
        client = tritonclient.grpc.InferenceServerClient(node.grpc_target)

``MLSERVER`` is the ``mlserver`` program of the repository's own MLServer environment
(``.mlserver/bin/mlserver``, made by scripts/install_mlserver.sh, which scripts/test.sh runs),
else the first on PATH, else None (the mlserver tests skip, naming the install script). Each
server gets its own directory ``tmp_path/mlserver-*`` with its log (``mlserver.log``); its
environment is ``tfscache.kinds.mlserver.launcher.command``'s: nothing loaded at start, bound to
127.0.0.1, ports chosen free just before (MLServer cannot report a port it picked).
``start_mlserver`` returns once ``GET /v2/health/live`` answers 200; if the process exits first
or ``timeout`` passes, it raises ``MLServerStartError`` with the log.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from support.oip import NodeSampler, OipServerProcess, wait_live
from support.process import REPO

from tfscache.kinds.mlserver import launcher
from tfscache.kinds.supervisor import free_ports

_OWN = REPO / ".mlserver" / "bin" / "mlserver"
MLSERVER: Path | None = _OWN if _OWN.is_file() else (Path(p) if (p := shutil.which("mlserver")) else None)
PYTHON: Path | None = MLSERVER.parent / "python" if MLSERVER is not None else None
# For a serve whose node switches models under concurrent traffic: a load waits up to 2 minutes for
# a busy model to go idle (default 30 s). On a shared 2-core machine MLServer's loads and first
# infers can take tens of seconds; what those tests check is that no request fails by eviction.
PATIENT = ("--set", "cache.room_timeout_s=120")
SKIP_REASON = "MLServer is not installed: run scripts/install_mlserver.sh (scripts/test.sh does)"


class MLServerStartError(RuntimeError):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- mlserver log ---\n{log[-8000:]}")


class MLServerProcess(OipServerProcess):
    """A running ``mlserver start``; stopping it ends its process group (its inference workers too).

    ``grpc_target``, ``rest_url``/``http_url`` and ``http_target`` ("127.0.0.1:M") as for Triton.
    """

    def __init__(self, process: subprocess.Popen, directory: Path, log_path: Path, ports: dict) -> None:
        super().__init__(process, directory, log_path, ports)
        self.ports = ports

    def kill(self) -> None:
        """SIGKILL the server and everything in its process group."""
        _killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            _killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def __enter__(self) -> MLServerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_mlserver(tmp_path: Path, repository: Path, *, extra: Iterable[str] = (), timeout: float = 120.0,
                   ports: dict[str, int] | None = None) -> MLServerProcess:
    """Start ``mlserver start repository`` and wait until it is live (``ports``: the same again)."""
    assert MLSERVER is not None, SKIP_REASON
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="mlserver-", dir=tmp_path))
    log_path = directory / "mlserver.log"
    ports = dict(ports) if ports else dict(zip(("grpc", "rest", "metrics"), free_ports(3)))
    argv, env = launcher.command(MLSERVER, Path(repository), http_port=ports["rest"], grpc_port=ports["grpc"],
                                 metrics_port=ports["metrics"], metrics_dir=directory / "metrics", extra=extra)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=directory, env=env, start_new_session=True)
    ports["pid"] = process.pid
    node = MLServerProcess(process, directory, log_path, ports)
    try:
        wait_live(node, timeout, "mlserver", lambda message, _: MLServerStartError(message, node.log_text()),
                  interval=0.1)
    except BaseException:
        node.kill()
        raise
    return node


# --- tfscache serve --backend mlserver: its children, their indexes ---

RESIDENT_STATES = frozenset({"READY", "UNKNOWN"})  # UNKNOWN: registered, still loading
_NODE_SERVING = re.compile(r"((?:node|host)\d+) serving: pid (\d+), gRPC (\d+), REST (\d+)")


def serve_nodes(serve) -> dict[str, dict[str, int]]:
    """{"node0": {"pid", "grpc", "rest"}, ...} of a ``tfscache serve --backend mlserver``'s children,
    from the supervisor's ``nodeI serving: pid P, gRPC G, REST R`` lines (the last of each wins)."""
    nodes: dict[str, dict[str, int]] = {}
    for match in _NODE_SERVING.finditer(serve.log_text()):
        nodes[match.group(1)] = {"pid": int(match.group(2)), "grpc": int(match.group(3)),
                                 "rest": int(match.group(4))}
    return nodes


def index_states(http_url: str, timeout: float = 10.0) -> dict[str, str]:
    """{model name: state} from the node's own repository index, one REST call: one snapshot."""
    import requests

    reply = requests.post(f"{http_url}/v2/repository/index", json={}, timeout=timeout)
    reply.raise_for_status()
    return {m["name"]: m["state"] for m in reply.json()}


def resident_models(http_url: str, timeout: float = 10.0) -> set[str]:
    return {name for name, state in index_states(http_url, timeout).items() if state in RESIDENT_STATES}


class IndexSampler(NodeSampler):
    """Samples nodes' own repository index (REST) in a background thread until stopped.

    One index answer is one snapshot of what the node holds, so the number of resident models
    in it is what the node held at that instant. ``urls``: {node name: http url}, or a callable
    returning it; a node that does not answer is counted in ``errors``.
    """

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, url in self._nodes().items():
                try:
                    self.samples.setdefault(name, []).append(resident_models(url, 5.0))
                except Exception:  # noqa: BLE001 - a node restarting: no sample
                    self.errors += 1
            self._stop.wait(0.005)  # pacing: leave the cores to the traffic under test


def mlserver_infer(module, client, name: str, x: float, timeout: float = 120.0, version: str = "") -> list[float]:
    """One infer of an ``addk_K`` model with x = [[x]] (tritonclient.grpc or .http, JSON tensors);
    its ``predict`` as a flat list."""
    import numpy as np

    tensor = module.InferInput("x", [1, 1], "FP32")
    if module.__name__.endswith("http"):
        tensor.set_data_from_numpy(np.array([[x]], dtype=np.float32), binary_data=False)
        result = client.infer(name, [tensor], model_version=version)
    else:
        tensor.set_data_from_numpy(np.array([[x]], dtype=np.float32))
        result = client.infer(name, [tensor], model_version=version, client_timeout=timeout)
    return result.as_numpy("predict").reshape(-1).tolist()
