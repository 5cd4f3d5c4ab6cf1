"""What ``tfscache serve`` checks after its settings and before it starts any process.

The settings check themselves (``tfscache.settings.load``); this checks what they ask of the
machine: the extras and programs the chosen nodes need (the settings check the [storage]
extra of an object-store repository themselves). Each problem raises
``SettingsError`` (a program that is not there, naming the setting and its value) or
``MissingExtra`` (the pip command that installs it); both exit 2 before any node starts.
"""

from __future__ import annotations

import shlex
import shutil

from tfscache.extras import require
from tfscache.settings import Settings, SettingsError


def check(settings: Settings) -> None:
    """Raise ``SettingsError`` or ``MissingExtra`` for the first thing ``settings`` need but lack."""
    node = settings.node
    if settings.sidecar:
        return  # the node is someone else's process
    if node.backend == "triton":
        require("triton", "node.backend = triton (embedded Triton nodes)")
    elif not node.node_command:
        require("node", "embedded `tfscache node` children (or give --node-command tensorflow_model_server)")
    if node.node_command:
        _check_program(node.node_command)


def _check_program(command: str) -> None:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise SettingsError(f"bad value for setting node.node_command: {command!r} ({exc})") from None
    if not argv or shutil.which(argv[0]) is None:
        raise SettingsError(f"bad value for setting node.node_command: {command!r} "
                            f"(no such program: {argv[0] if argv else command!r})")
