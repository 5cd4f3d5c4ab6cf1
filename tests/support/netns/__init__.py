"""Hosts as Linux network namespaces on a private bridge, for cluster tests under partitions.

    reason = unavailable()                       # None, or why namespaces cannot be used here
    with Network() as net:                       # a bridge with 10.231.N.1/24, N free on this machine
        a = net.host("a")                        # namespace, veth pair on the bridge, 10.231.N.10, lo up
        proc = a.popen(["python", "-m", "tfscache", "node", ...], log_path)   # ip netns exec
        a.cut(); a.heal()                        # its link on the bridge down (packets dropped), up again
        a.kill_all()                             # SIGKILL every process in the namespace at once

Everything it makes is named after the subnet's third octet (bridge ``tfbN``, links ``tfvNhI``,
namespaces ``tfsN-NAME``), and ``close`` removes all of it (processes first), also after a
failure. The subnet is one that no interface on this machine has, and nothing outside the
namespaces and the bridge created here is ever addressed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PREFIX = "10.231"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (not root, no ``ip``, no netns support); None if they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"network namespaces need root (the tests run as uid {os.geteuid()})"
    probe = f"tfsprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        link = _ip("link", "add", f"tfp{os.getpid() % 100000}", "type", "bridge", check=False)
        if link.returncode != 0:
            return f"cannot create a bridge: {link.stderr.strip()}"
        _ip("link", "del", f"tfp{os.getpid() % 100000}", check=False)
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def _free_octet() -> int:
    """A third octet N such that no address of this machine is in 10.231.N.0/24 (nor a link of ours named so)."""
    used = _ip("-4", "-o", "addr").stdout + _ip("-o", "link").stdout
    for n in range(10 + os.getpid() % 200, 255):
        if f"{PREFIX}.{n}." not in used and f"tfb{n}:" not in used and f"tfb{n}@" not in used:
            return n
    for n in range(1, 255):
        if f"{PREFIX}.{n}." not in used and f"tfb{n}:" not in used:
            return n
    raise RuntimeError("no free 10.231.N.0/24 subnet")


class Host:
    """One network namespace with one address on the bridge."""

    def __init__(self, network: Network, name: str, index: int) -> None:
        self.network, self.name, self.index = network, name, index
        self.netns = f"tfs{network.octet}-{name}"
        self.veth = f"tfv{network.octet}h{index}"  # the root side, on the bridge
        self.address = f"{PREFIX}.{network.octet}.{index}"
        self.processes: list[subprocess.Popen] = []

    def setup(self) -> None:
        inner = f"tfi{self.network.octet}h{self.index}"
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", self.netns)
        _ip("link", "set", self.veth, "master", self.network.bridge)
        _ip("link", "set", self.veth, "up")
        self.exec("ip", "link", "set", "lo", "up")
        self.exec("ip", "link", "set", inner, "name", "eth0")
        self.exec("ip", "addr", "add", f"{self.address}/24", "dev", "eth0")
        self.exec("ip", "link", "set", "eth0", "up")

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def exec(self, *argv: str) -> str:
        """Run a short command in the namespace; its stdout (CalledProcessError on failure)."""
        return subprocess.run(self.command(list(argv)), capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def popen(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` in the namespace (``ip netns exec`` execs it: the pid is the program's)."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen(self.command(argv), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=cwd,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, timeout: float = 30.0) -> list[int]:
        """SIGKILL every process in the namespace at once (a host that dies whole); the pids killed."""
        killed = self.pids()
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:  # reap our children
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition with a deadline
        return killed

    def cut(self) -> None:
        """Take its link on the bridge down: every packet to and from it is dropped."""
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")

    def remove(self) -> None:
        self.kill_all(10)
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.netns, check=False)


class Network:
    """A bridge on 10.231.N.0/24 (N free here) and the namespaces on it."""

    def __init__(self) -> None:
        self.octet = 0
        self.bridge = ""
        self.hosts: dict[str, Host] = {}
        self._next = 10

    @property
    def gateway(self) -> str:
        """The bridge's own address (the test process, in the root namespace, reaches every host from it)."""
        return f"{PREFIX}.{self.octet}.1"

    def start(self) -> Network:
        self.octet = _free_octet()
        self.bridge = f"tfb{self.octet}"
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            self.close()
            raise
        return self

    def host(self, name: str) -> Host:
        """A new namespace ``name`` with the next address (.10, .11, ...) on the bridge."""
        host = Host(self, name, self._next)
        self._next += 1
        self.hosts[name] = host
        try:
            host.setup()
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"setting up namespace {host.netns} failed: {exc.stderr}") from exc
        return host

    def close(self) -> None:
        """Every process in the namespaces killed, the links, namespaces and bridge removed."""
        for host in self.hosts.values():
            host.remove()
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
