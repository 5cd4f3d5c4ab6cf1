"""Find MLServer's ``mlserver`` and build the command line of one node child (no mlserver import).

    binary = find_mlserver(node_command)          # --node-command, else `mlserver` on PATH
    argv, env = command(binary, repository, http_port=..., grpc_port=..., metrics_port=...)

MLServer lives in a virtual environment of its own (MLServer 1.7 needs protobuf below 7,
tfscache pins 7: docs/mlserver.md, "Install"), so tfscache never imports it: it runs
``mlserver start REPOSITORY`` and talks to it over gRPC. Its settings are given as MLServer's
own environment variables (``MLSERVER_*``, read by its pydantic settings):

* ``MLSERVER_LOAD_MODELS_AT_STARTUP=false``: nothing loaded at start; the cache decides;
* ``MLSERVER_METRICS_DIR``: the node's own directory in the state directory (MLServer's workers
  share their Prometheus counters there; its default is ``.metrics`` in the working directory);
* ``MLSERVER_HOST=127.0.0.1`` and the HTTP, gRPC and metrics ports: MLServer cannot bind port 0
  and report the port, so callers choose free ones (``free_ports``: bind, read, close; the
  accepted race, as for tensorflow_model_server and tritonserver);
* ``node.extra_args``: more ``MLSERVER_NAME=VALUE`` settings (``MLSERVER_PARALLEL_WORKERS=2``),
  which come last and win. ``mlserver start`` takes no other arguments.

A ``settings.json`` in the repository is read by MLServer too, and its values win over these
variables: it must not set the host, the ports or ``load_models_at_startup``.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path

from tfscache.kinds.supervisor import Launch, Launcher, NodeProcess, free_ports
from tfscache.kinds.table import NodeKind
from tfscache.settings import NodeSection, Settings, SettingsError

INSTALL_HINT = (
    "python3.11 -m venv .mlserver && .mlserver/bin/pip install mlserver==1.7.1 "
    "mlserver-sklearn==1.7.1 mlserver-xgboost==1.7.1 'uvloop<0.22', then put .mlserver/bin on "
    "PATH or give --node-command .mlserver/bin/mlserver (docs/mlserver.md)"
)


class MLServerNotFound(RuntimeError):
    """No ``mlserver`` program here; the message says how to install one."""


def find_mlserver(node_command: str = "") -> Path:
    """The ``mlserver`` program: ``node_command`` (node.node_command) if given, else the first on PATH."""
    if node_command:
        argv = shlex.split(node_command)
        found = shutil.which(argv[0]) if argv else None
        if found is None:
            raise MLServerNotFound(f"node.node_command {node_command!r}: no such program")
        return Path(found)
    found = shutil.which("mlserver")
    if found is None:
        raise MLServerNotFound(f"mlserver not found on PATH; install it: {INSTALL_HINT}")
    return Path(found)


def settings_env(extra: Iterable[str]) -> dict[str, str]:
    """``node.extra_args`` as MLServer settings: each ``MLSERVER_NAME=VALUE``; ValueError otherwise."""
    env = {}
    for item in extra:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("MLSERVER_") or not name.replace("_", "").isalnum():
            raise ValueError(
                f"node.extra_args for mlserver nodes are MLServer settings MLSERVER_NAME=VALUE; "
                f"got {item!r}"
            )
        env[name] = value
    return env


def command(binary: Path, repository: Path, *, http_port: int, grpc_port: int, metrics_port: int,
            metrics_dir: Path, address: str = "127.0.0.1",
            extra: Iterable[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` for ``mlserver start`` over ``repository`` with nothing loaded at start;
    ``metrics_dir``: where its workers share their Prometheus counters (default: .metrics in the cwd).
    """
    env = dict(os.environ)
    env.update({
        "MLSERVER_LOAD_MODELS_AT_STARTUP": "false",
        "MLSERVER_HOST": address,
        "MLSERVER_HTTP_PORT": str(http_port),
        "MLSERVER_GRPC_PORT": str(grpc_port),
        "MLSERVER_METRICS_PORT": str(metrics_port),
        "MLSERVER_METRICS_DIR": str(metrics_dir),
    })
    env.update(settings_env(extra))
    return [str(binary), "start", str(repository)], env


def launcher(settings: NodeSection, repository: Path, state_dir: Path) -> Launcher:
    """The launch of each child over ``repository``; fails at start-up, naming the install, when no
    ``mlserver`` is found (``--node-command``: the one to run)."""
    binary = find_mlserver(settings.node_command)
    settings_env(settings.extra_args)  # a bad node.extra_args fails here, not at each start

    def launch(node: NodeProcess) -> Launch:
        # MLServer cannot report port 0
        node.grpc_port, node.rest_port, metrics_port = free_ports(3)
        argv, env = command(
            binary,
            repository,
            http_port=node.rest_port,
            grpc_port=node.grpc_port,
            metrics_port=metrics_port,
            metrics_dir=state_dir / f"{node.name}.mlserver-metrics",
            extra=settings.extra_args,
        )
        return Launch(argv, env)

    return launch


def preflight(settings: Settings, kind: NodeKind) -> None:
    """Embedded MLServer nodes need an ``mlserver`` program (in an environment of its own, so no pip
    extra of tfscache's) and ``node.extra_args`` that are MLServer settings."""
    try:
        find_mlserver(settings.node.node_command)
        settings_env(settings.node.extra_args)
    except MLServerNotFound as e:
        raise SettingsError(f"node.backend = mlserver (embedded MLServer nodes): {e}") from None
    except ValueError as e:
        raise SettingsError(f"bad value for setting node.extra_args: {e}") from None
