"""Start real ``tfscache node`` processes for integration tests.

    from support.node import start_node

    with start_node(tmp_path, model_name="half_plus_two",
                    model_base_path=str(test_models / "half_plus_two")) as node:
        channel = grpc.insecure_channel(node.grpc_target)

Each node gets its own directory under ``tmp_path`` (config, ports file, log). It runs
``.venv/bin/python -m tfscache node --port=0 --rest_api_port=0 --bind_address=127.0.0.1
--ports_file=... --file_system_poll_wait_seconds=0.1``; the caller's ``flags`` replace
any of those by name. Nodes are forked from the session's node template
(tfscache.modelserver.template: TensorFlow imported once, a node serving in ~0.1 s instead of ~5 s);
``forked=False`` (or an ``env``) runs a fresh interpreter instead, for a test that needs the
node's own command line or an environment TensorFlow reads at import. ``start_node`` returns
once the node wrote its ports file, i.e. once its start-up config loaded and both servers serve; if the process exits first it
raises ``NodeStartError`` with the node's log.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from support.process import (
    REPO,
    ServerProcess,
    launch,
    started_together,
    wait_for_ports,
)

_VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON if _VENV_PYTHON.exists() else Path(sys.executable))
_counter = itertools.count(1)
_template_lock = threading.Lock()
_template: list = []  # [(process, socket path)] once started


def node_template() -> str:
    """The socket of this session's node template, started on first use (it dies with this process)."""
    from tfscache.modelserver import template

    with _template_lock:
        if _template and _template[0][0].poll() is None:
            return _template[0][1]
        directory = Path(tempfile.mkdtemp(prefix="tfscache-template-"))
        path = str(directory / "template.sock")
        with open(directory / "template.log", "wb") as log:
            process = subprocess.Popen([PYTHON, "-m", "tfscache.modelserver.template", path], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        template.wait_for_socket(path, lambda: process.poll() is None, 120)
        if not _template:
            atexit.register(_stop_template)
        _template[:] = [(process, path)]
        return path


def _stop_template() -> None:
    for process, path in _template:
        process.terminate()
        process.wait(30)
        shutil.rmtree(Path(path).parent, ignore_errors=True)


class NodeStartError(RuntimeError):
    """The node exited (or timed out) before it wrote its ports file."""

    def __init__(self, message: str, returncode: int | None, log: str) -> None:
        super().__init__(f"{message}\n--- node log ---\n{log[-8000:]}")
        self.returncode = returncode
        self.log = log


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0]


def node_command(flags: Iterable[str]) -> list[str]:
    """The command line of ``tfscache node`` with these flags."""
    return [PYTHON, "-m", "tfscache", "node", *flags]


class NodeProcess(ServerProcess):
    """A running ``tfscache node``; a context manager that stops it on exit."""

    def __init__(self, process: subprocess.Popen, directory: Path, log_path: Path,
                 config_path: Path | None, ports: dict) -> None:
        super().__init__(process, directory, log_path, ports)
        self.config_path = config_path


def start_node(tmp_path: Path, *, config: str | None = None, model_name: str | None = None,
               model_base_path: str | None = None, flags: Iterable[str] = (),
               env: dict[str, str] | None = None, timeout: float = 90.0, forked: bool = True) -> NodeProcess:
    """Start ``tfscache node`` and wait until it serves.

    ``config``: text-format ModelServerConfig written to the node's directory and
    passed as --model_config_file. ``model_name``/``model_base_path``: the single-model
    flags. ``flags`` are extra flags and override the defaults above by name.
    ``env`` is added to this process's environment. ``forked``: from the node template (see above).
    """
    directory = Path(tmp_path) / f"node-{next(_counter)}"
    directory.mkdir(parents=True)
    ports_file = directory / "ports.json"
    log_path = directory / "node.log"
    config_path = None
    defaults = ["--port=0", "--rest_api_port=0", "--bind_address=127.0.0.1",
                f"--ports_file={ports_file}", "--file_system_poll_wait_seconds=0.1"]
    if config is not None:
        config_path = directory / "models.config"
        config_path.write_text(config)
        defaults.append(f"--model_config_file={config_path}")
    if model_name is not None:
        defaults.append(f"--model_name={model_name}")
    if model_base_path is not None:
        defaults.append(f"--model_base_path={model_base_path}")
    flags = list(flags)
    overridden = {_flag_name(flag) for flag in flags}
    command = node_command([f for f in defaults if _flag_name(f) not in overridden] + flags)
    if forked and not env:
        from tfscache.modelserver.template import Child

        log_path.write_bytes(b"")
        process = Child(node_template(), command[3:], env={**os.environ, "PYTHONUNBUFFERED": "1"},
                        cwd=str(REPO), output=str(log_path), new_session=False)
    else:
        process = launch(command, log_path, env)
    ports = wait_for_ports(process, ports_file, log_path, timeout, NodeStartError)
    return NodeProcess(process, directory, log_path, config_path, ports)


def started_nodes(tmp_path: Path, flag_lists: list[list[str]], *, config: str | None = None
                  ) -> contextlib.AbstractContextManager[list[NodeProcess]]:
    """One node per entry of ``flag_lists`` (``start_node``'s ``flags``), started concurrently
    (``support.process.started_together``): every node that started is stopped on exit, and also
    when another failed to start."""
    return started_together([functools.partial(start_node, tmp_path, config=config, flags=flags)
                             for flags in flag_lists])


def model_config(models: dict[str, str | Path], **per_model: str) -> str:
    """Text-format ModelServerConfig for {name: base_path} (platform tensorflow).

    ``per_model[name]`` adds raw text-format fields to that model's entry, e.g.
    ``model_config({"m": p}, m="model_version_policy { all {} }")``.
    """
    entries = []
    for name, base_path in models.items():
        extra = per_model.get(name, "")
        entries.append(f'  config {{ name: "{name}" base_path: "{base_path}" '
                       f'model_platform: "tensorflow" {extra} }}')
    return "model_config_list {\n" + "\n".join(entries) + "\n}\n"


# -- gRPC helpers (import tensorflow_serving lazily: tests may import it, the sidecar not) --


def version_status(stub, name: str, timeout: float = 10.0) -> list:
    """GetModelStatus's model_version_status entries for ``name``; [] if NOT_FOUND."""
    import grpc

    from support.requests import status_request

    try:
        return list(stub.GetModelStatus(status_request(name), timeout=timeout).model_version_status)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return []
        raise


def version_status_at(target: str, name: str, timeout: float = 30.0) -> list:
    """``version_status`` from the server at ``target`` ("host:port"), over a channel of its own."""
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        return version_status(model_service_pb2_grpc.ModelServiceStub(channel), name, timeout)


def version_states(stub, name: str) -> dict[int, tuple[str, int, str]]:
    """{version: (state name, error_code, error_message)} from GetModelStatus; {} if NOT_FOUND."""
    from tensorflow_serving.apis import get_model_status_pb2

    names = get_model_status_pb2.ModelVersionStatus.State.Name
    return {s.version: (names(s.state), s.status.error_code, s.status.error_message)
            for s in version_status(stub, name)}


def wait_for_states(stub, name: str, expected: dict[int, str], timeout: float = 30.0) -> dict:
    """Wait until GetModelStatus shows exactly these {version: state name}."""
    deadline = time.monotonic() + timeout
    while True:
        states = version_states(stub, name)
        if {v: s[0] for v, s in states.items()} == expected:
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: wanted {expected}, have {states}")
        time.sleep(0.02)
