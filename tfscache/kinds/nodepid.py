"""Find the PID of the model server behind a sidecar's ``node.node_address``.

In sidecar mode the node is not this process's child, so its PID must be found
before the cache manager can measure the node's resident memory (model sizes as
the RSS growth across a load instead of estimates). ``find_node_pid(host, port)``:

1. ``host`` must be this host (a loopback name or address, or one of this host's
   interface addresses); otherwise the node's process is not visible here: None.
2. The process with a *listening* TCP socket on ``port`` (psutil.net_connections).
   Reading other users' sockets may need privileges: psutil raises AccessDenied,
   and step 3 is tried instead.
3. A process whose command line is ``tensorflow_model_server`` (or ``tfscache
   node``) with ``--port=PORT`` (or ``--port PORT``); exactly one must match.

None when nothing is found; the reason is logged once per address (WARNING), the
find itself at INFO. Needs only psutil (a base dependency); no tensorflow.

``NodeMemory`` is what the cache manager reads: the node process's RSS, and, given
a way to find the PID, the process found again when the node was replaced (TF
Serving restarted in its container) instead of falling back to estimates for good.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable

import psutil

log = logging.getLogger("tfscache.kinds.nodepid")

_WILDCARDS = {"0.0.0.0", "::", "::ffff:0.0.0.0"}
_logged: set[tuple[str, int]] = set()


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, ``localhost``, this hostname, an own address)."""
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host in ("localhost", "") or host == socket.gethostname():
            return True
        try:  # a name: resolved once, at start-up (the usual node_address is 127.0.0.1: no lookup)
            address = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    if address.is_loopback:
        return True
    own = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family in (socket.AF_INET, socket.AF_INET6)}
    return str(address) in own


def listening_pid(port: int) -> int | None:
    """The PID listening on TCP ``port``; None if none. Raises psutil.AccessDenied without privileges."""
    pids = {c.pid for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    pids.discard(os.getpid())
    return pids.pop() if len(pids) == 1 else None


def _port_flag(cmdline: list[str]) -> str | None:
    for i, arg in enumerate(cmdline):
        if arg.startswith("--port="):
            return arg.split("=", 1)[1]
        if arg == "--port" and i + 1 < len(cmdline):
            return cmdline[i + 1]
    return None


def _is_model_server(cmdline: list[str]) -> bool:
    if not cmdline:
        return False
    if os.path.basename(cmdline[0]) == "tensorflow_model_server":
        return True
    # `tfscache node ...`, or `python -m tfscache node ...`
    for i, arg in enumerate(cmdline[:-1]):
        if os.path.basename(arg) == "tfscache" and cmdline[i + 1] == "node":
            return True
    return False


def cmdline_pid(port: int) -> int | None:
    """The one model server process started with ``--port=PORT``; None if none or several."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if _is_model_server(cmdline) and _port_flag(cmdline) == str(port):
            found.append(proc.info["pid"])
    return found[0] if len(found) == 1 else None


def find_node_pid(host: str, port: int) -> int | None:
    """The PID of the process serving ``host:port`` on this host, or None (logged once per address)."""
    key = (host, port)
    if not is_local_host(host):
        _once(key, "node %s:%s is not on this host; model sizes stay estimates", host, port)
        return None
    how = "listening socket"
    try:
        pid = listening_pid(port)
    except psutil.AccessDenied:
        pid, how = None, "command line (listening sockets not readable)"
    if pid is None:
        pid = cmdline_pid(port)
        how = "command line" if how == "listening socket" else how
    if pid is None:
        _once(key, "no process found serving node port %s on this host (listening socket or "
                   "tensorflow_model_server --port=%s); model sizes stay estimates", port, port)
        return None
    log.info("node %s:%s is process %s (found by its %s)", host, port, pid, how)
    return pid


def _once(key: tuple[str, int], message: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(message, *args)


class NodeMemory:
    """The resident memory of a node's process; re-found through ``find`` once that process is gone.

    ``find`` (sidecar mode: ``find_node_pid`` of the node's address) runs when the process
    known is gone or none is known, at most every ``retry_s`` seconds while it finds nothing.
    """

    def __init__(self, pid: int | None, find: Callable[[], int | None] | None = None,
                 retry_s: float = 30.0) -> None:
        self._find = find
        self._retry_s = retry_s
        self._next_find = 0.0
        self._process = _process(pid)
        self._seen_pid = self.pid  # for ``replaced``

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def rss(self, *, children: bool = False) -> int | None:
        """Bytes resident in the node's process now (``children``: and in every process under it, as
        Triton's python-backend stubs); None when it cannot be measured."""
        process = self._current()
        if process is None:
            return None
        try:
            rss = process.memory_info().rss
            tree = process.children(recursive=True) if children else []
        except psutil.Error:  # gone between the check and the read
            return None
        for child in tree:
            try:
                rss += child.memory_info().rss
            except psutil.Error:  # exited meanwhile
                pass
        return rss

    def replaced(self) -> bool:
        """Whether the node's process was replaced (found again with another pid) since the last call."""
        pid = self.pid
        changed = self._seen_pid is not None and pid is not None and pid != self._seen_pid
        self._seen_pid = pid
        return changed

    def _current(self) -> psutil.Process | None:
        process = self._process
        if process is not None and _alive(process):
            return process
        if self._find is None or time.monotonic() < self._next_find:
            return None
        old = process.pid if process is not None else None
        self._process = _process(self._find())
        if self._process is None:
            self._next_find = time.monotonic() + self._retry_s
        elif old is not None and self._process.pid != old:
            log.info(
                "node process %s is gone; measuring its replacement, process %s",
                old,
                self._process.pid,
            )
        return self._process


def _alive(process: psutil.Process) -> bool:
    """Running (the same process: psutil checks its start time) and not a zombie nobody reaped yet."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _process(pid: int | None) -> psutil.Process | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:
        log.warning("node process %s is not visible; model sizes stay estimates", pid)
        return None
