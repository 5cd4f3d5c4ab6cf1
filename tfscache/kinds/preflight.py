"""What ``tfscache serve`` checks after its settings and before it starts any process.

The settings check themselves (``tfscache.settings.load``); this checks what they ask of the
machine: the extras and programs the chosen nodes need (the settings check the [storage]
extra of an object-store repository themselves), that the bind addresses are addresses
this host can bind, and that the directories it will write to can be written. A port in use
is not checked here (that would race with whoever takes it): the bind fails at start, exit 1. Each
problem raises
``SettingsError`` (a program that is not there, naming the setting and its value) or
``MissingExtra`` (the pip command that installs it); both exit 2 before any node starts.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import tempfile
from pathlib import Path

from tfscache.extras import require
from tfscache.kinds.table import KINDS
from tfscache.settings import Settings, SettingsError


def check(settings: Settings) -> None:
    """Raise ``SettingsError`` or ``MissingExtra`` for the first thing ``settings`` need but lack."""
    _check_host("server.bind_address", settings.server.bind_address)
    if settings.server.admin_port >= 0:
        _check_host("server.admin_bind_address", settings.server.admin_bind_address)
    if settings.server.ports_file:
        _check_writable(
            "server.ports_file",
            settings.server.ports_file,
            Path(settings.server.ports_file).parent,
            create=False,
        )
    for dotted, value in (("node.state_dir", settings.node.state_dir),
                          ("storage.cache_dir", settings.storage.cache_dir)):
        if value:
            _check_writable(dotted, value, Path(value))
    # without a GPU the cap is off (a log line); without pynvml, a mistake
    if settings.cache.gpu_memory_per_node:
        require("gpu", f"cache.gpu_memory_per_node = {settings.cache.gpu_memory_per_node}")
    node = settings.node
    if settings.sidecar:
        return  # the node is someone else's process
    kind = KINDS[node.backend]
    kind.part("preflight")(settings, kind)
    if node.node_command:
        _check_program(node.node_command)


def _check_program(command: str) -> None:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise SettingsError(
            f"bad value for setting node.node_command: {command!r} ({exc})"
        ) from None
    if not argv or shutil.which(argv[0]) is None:
        raise SettingsError(f"bad value for setting node.node_command: {command!r} "
                            f"(no such program: {argv[0] if argv else command!r})")


def _check_host(dotted: str, host: str) -> None:
    try:
        socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise SettingsError(
            f"bad value for setting {dotted}: {host!r} (not an address of this host's "
            f"families, nor a name that resolves: {exc})"
        ) from None


def _check_writable(dotted: str, value: str, directory: Path, *, create: bool = True) -> None:
    """``directory`` can be written (``create``: or made, under its nearest existing parent).

    Tried, not judged from permission bits (root passes ``os.access`` on /proc): a directory is
    made and removed again there."""
    path = directory.absolute()
    while create and not path.exists() and path != path.parent:
        path = path.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tfscache-check-", dir=path))
    except OSError as exc:
        raise SettingsError(f"bad value for setting {dotted}: {value!r} (cannot write in {path}: "
                            f"{exc.strerror or exc})") from None
