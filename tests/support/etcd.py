"""Start real etcd servers (Debian's etcd-server, /usr/bin/etcd) on loopback for tests.

    from support.etcd import EtcdCluster

    with EtcdCluster(tmp_path, size=3) as cluster:
        cluster.endpoints          # ["http://127.0.0.1:P1", ...], one per member
        cluster.kill(0)            # SIGKILL member 0
        cluster.restart(0)         # same ports and data dir; waits until it is healthy

etcd cannot report a port it bound itself, so the ports come from the OS: bind
127.0.0.1:0 for every client and peer port at once (so they differ), note them,
close the sockets and hand them to etcd. Another process could take one in that
gap; when a member then fails to start, the whole cluster is started again on new
ports (up to three times). Each member has its own data dir and log file under the
given directory; ``start`` returns once every member answers ``GET /health`` with
``{"health": "true"}`` (it has a leader).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tfscache.kinds.supervisor import free_ports

ETCD = os.environ.get("TFSCACHE_TEST_ETCD", shutil.which("etcd") or "/usr/bin/etcd")


class EtcdStartError(RuntimeError):
    """An etcd member did not become healthy; the message carries its log."""


class EtcdMember:
    """One etcd process: its name, ports, data dir and log."""

    def __init__(self, name: str, directory: Path, client_port: int, peer_port: int) -> None:
        self.name, self.client_port, self.peer_port = name, client_port, peer_port
        self.data_dir = directory / f"{name}.data"
        self.log_path = directory / f"{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def launch(self, initial_cluster: str, token: str) -> None:
        args = [ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", token, "--log-level", "warn"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def signal(self, sig: int) -> None:
        if self.alive:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


class EtcdCluster:
    """``size`` etcd members forming one cluster on loopback."""

    def __init__(self, directory: Path, size: int = 1, start_timeout_s: float = 30.0) -> None:
        self.directory, self.size, self.start_timeout_s = Path(directory), size, start_timeout_s
        self.members: list[EtcdMember] = []
        self._initial = self._token = ""

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self) -> EtcdCluster:
        for attempt in range(3):
            ports = free_ports(2 * self.size)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.members = [EtcdMember(f"etcd{i}", self.directory / f"try{attempt}", ports[2 * i],
                                       ports[2 * i + 1]) for i in range(self.size)]
            self.members[0].data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            self._token = f"tfscache-test-{os.getpid()}-{attempt}"
            for member in self.members:
                member.launch(self._initial, self._token)
            try:
                self.wait_healthy()
                return self
            except EtcdStartError:
                logs = "\n".join(m.log() for m in self.members)
                self.close()
                if "address already in use" not in logs or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def wait_healthy(self, indexes: list[int] | None = None, timeout: float | None = None) -> None:
        """Until the chosen members (default: all) report healthy; EtcdStartError with logs otherwise."""
        chosen = [self.members[i] for i in (range(self.size) if indexes is None else indexes)]
        deadline = time.monotonic() + (timeout or self.start_timeout_s)
        while True:
            pending = [m for m in chosen if not m.healthy()]
            if not pending:
                return
            dead = [m for m in pending if not m.alive]
            if dead or time.monotonic() > deadline:
                member = (dead or pending)[0]
                why = "exited" if dead else f"not healthy after {timeout or self.start_timeout_s} s"
                raise EtcdStartError(f"etcd member {member.name} {why}\n--- log ---\n{member.log()}")
            time.sleep(0.05)

    def kill(self, index: int) -> None:
        """SIGKILL one member (a crash)."""
        self.members[index].signal(signal.SIGKILL)

    def stop(self, index: int) -> None:
        """SIGTERM one member (a clean stop)."""
        self.members[index].signal(signal.SIGTERM)

    def restart(self, index: int, wait: bool = True) -> None:
        """Start a stopped member again on its ports and data dir; waits for health unless told not to."""
        member = self.members[index]
        if member.alive:
            raise RuntimeError(f"{member.name} is still running")
        member.launch(self._initial, self._token)
        if wait:
            self.wait_healthy([index])

    def close(self) -> None:
        for member in self.members:
            member.signal(signal.SIGKILL)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
