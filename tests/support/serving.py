"""Start real ``tfscache serve`` processes and build model repositories for front-end tests.

    with start_serve(tmp_path, repo, "--local-nodes", "2") as serve:
        stub = PredictionServiceStub(grpc.insecure_channel(serve.grpc_target))

Serve binds 127.0.0.1 on port 0 and reports its ports in ``--ports-file``; its node
state (the nodes' ports files) lives in ``serve.state_dir``. Its ``tfscache node`` children are
forked from the session's node template (support.node.node_template, ``node.template_socket``):
TensorFlow is imported once per session rather than once per serve (~5 s of CPU each).
``own_template=True``, a serve whose ``env`` sets a variable read as TensorFlow is imported
(``_IMPORT_PREFIXES``), or one that sets ``node.fork_nodes`` or another kind of node starts a
template of its own, as it would outside the tests.
"""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
from pathlib import Path

import requests

from support.node import PYTHON, node_template
from support.process import ServerProcess, launch, wait_for_ports
from support.waiting import wait_until

_counter = itertools.count(1)


class ServeStartError(RuntimeError):
    pass


class ServeProcess(ServerProcess):
    """A running ``tfscache serve``; a context manager that stops it (SIGTERM) on exit."""

    def __init__(self, process: subprocess.Popen, directory: Path, ports: dict) -> None:
        super().__init__(process, directory, directory / "serve.log", ports)
        self.state_dir = directory / "state"
        self.metrics_port: int | None = ports.get("metrics")  # with --metrics-port (0: the bound one)

    def node_status(self, index: int = 0) -> dict:
        """``/status``'s entry for local node ``index`` (on the metrics port)."""
        reply = requests.get(f"http://127.0.0.1:{self.metrics_port}/status", timeout=10)
        assert reply.status_code == 200
        return reply.json()["nodes"][index]

    def node_ports(self, name: str) -> dict:
        """The ports file of local node ``name`` (node0, node1, ...): grpc, rest, pid.

        ``{}`` while the node restarts (its old file is gone, the new one not yet written).
        """
        try:
            return json.loads((self.state_dir / f"{name}.ports.json").read_text())
        except FileNotFoundError:
            return {}

    def stop(self, timeout: float = 60.0) -> int:
        return super().stop(timeout)


def request_log_rows(path: Path) -> list[dict]:
    """The rows of a ``--request-log`` CSV written so far ([] before its first row)."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def wait_for_log_rows(path: Path, count: int, timeout: float = 60.0) -> list[dict]:
    """The request log's rows once it has ``count`` (rows are appended as requests end)."""
    return wait_until(lambda: rows if len(rows := request_log_rows(path)) == count else None, timeout,
                      f"{count} rows in the request log {path}")


def serve_command(args) -> list[str]:
    return [PYTHON, "-m", "tfscache", "serve", *args]


def forks_tfscache_nodes(args) -> bool:
    """Whether a serve with these arguments forks ``tfscache node`` children from a template."""
    args = [str(a) for a in args]
    backend = args[args.index("--backend") + 1] if "--backend" in args else "tfserving"
    return (backend == "tfserving" and "--node-command" not in args
            and not any(a.startswith(("node.fork_nodes", "node.template_socket")) for a in args))


# Variables TensorFlow (or the interpreter) reads as it is imported: a node forked from a template
# has the template's, so a serve that sets one of them starts its own template.
_IMPORT_PREFIXES = ("TF_", "CUDA_", "XLA_", "OMP_", "KMP_", "MKL_", "PYTHON", "LD_")


def _read_at_import(env: dict[str, str] | None) -> bool:
    return any(key.startswith(_IMPORT_PREFIXES) for key in env or {})


def start_serve(tmp_path: Path, repository: Path, *args: str, timeout: float = 180.0,
                env: dict[str, str] | None = None, cls: type[ServeProcess] = ServeProcess,
                own_template: bool = False) -> ServeProcess:
    """Start ``tfscache serve`` over ``repository`` and wait until both front ends serve.

    ``cls`` (a ServeProcess subclass) wraps the running process; ``own_template``: see above.
    """
    directory = Path(tmp_path) / f"serve-{next(_counter)}"
    directory.mkdir(parents=True)
    if not own_template and not _read_at_import(env) and forks_tfscache_nodes(args):
        args = ("--set", f"node.template_socket={node_template()}", *args)
    ports_file = directory / "ports.json"
    command = serve_command(["--model-repository", str(repository), "--grpc-port", "0", "--rest-port", "0",
                             "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                             "--set", f"node.state_dir={directory / 'state'}", *args])
    log_path = directory / "serve.log"
    process = launch(command, log_path, env)
    ports = wait_for_ports(process, ports_file, log_path, timeout,
                           lambda message, rc, log: ServeStartError(f"{message} (rc={rc}):\n{log[-6000:]}"))
    return cls(process, directory, ports)


def link_repository(root: Path, bases) -> Path:
    """A model repository whose entries are symlinks to already built model directories."""
    root.mkdir(parents=True, exist_ok=True)
    for base in bases:
        base = Path(base)
        (root / base.name).symlink_to(base, target_is_directory=True)
    return root


def add_broken_model(root: Path) -> Path:
    """``root/broken/1``: a version whose saved_model.pb is not a SavedModel (every load fails)."""
    broken = Path(root) / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    return Path(root)
