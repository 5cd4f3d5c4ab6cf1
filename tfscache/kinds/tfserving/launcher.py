"""How embedded TF Serving nodes start: ``tfscache node`` children, or ``--node-command``.

Each child gets an empty ``model_config_list {}`` (the node's CacheManager alone fills it,
through HandleReloadConfigRequest) and TF Serving's flags. ``tfscache node`` binds port 0
and reports its ports in ``--ports_file``; ``--node-command`` (the real
tensorflow_model_server) cannot, so ports are chosen for it.
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path

from tfscache.kinds.supervisor import Launch, Launcher, NodeProcess, free_ports
from tfscache.kinds.table import NodeKind
from tfscache.settings import NodeSection, Settings

EMPTY_CONFIG = "model_config_list {\n}\n"


def launcher(settings: NodeSection, repository: Path, state_dir: Path) -> Launcher:
    """The launch of each child: its config file and ports file in ``state_dir``."""

    def launch(node: NodeProcess) -> Launch:
        config = state_dir / f"{node.name}.config"
        config.write_text(EMPTY_CONFIG)
        common = [
            f"--model_config_file={config}",
            f"--max_num_load_retries={settings.max_num_load_retries}",
            f"--num_load_threads={settings.num_load_threads}",
            "--num_unload_threads=1",
        ]
        if settings.node_command:
            node.grpc_port, node.rest_port = free_ports(2)
            poll = max(1, math.ceil(settings.file_system_poll_wait_seconds))  # an int32 flag there
            return Launch(
                [
                    *shlex.split(settings.node_command),
                    f"--port={node.grpc_port}",
                    f"--rest_api_port={node.rest_port}",
                    f"--file_system_poll_wait_seconds={poll}",
                    *common,
                    *settings.extra_args,
                ]
            )
        ports_file = state_dir / f"{node.name}.ports.json"
        command = [
            "node",
            "--port=0",
            "--rest_api_port=0",
            f"--ports_file={ports_file}",
            "--bind_address=127.0.0.1",
            f"--file_system_poll_wait_seconds={settings.file_system_poll_wait_seconds}",
            *common,
            *settings.extra_args,
        ]
        return Launch(
            [sys.executable, "-m", "tfscache", *command], ports_file=ports_file, forkable=command
        )

    return launch


def preflight(settings: Settings, kind: NodeKind) -> None:
    """Embedded `tfscache node` children need the [node] extra; a --node-command does not."""
    if not settings.node.node_command:
        kind.require_extra(
            "embedded `tfscache node` children (or give --node-command tensorflow_model_server)"
        )
