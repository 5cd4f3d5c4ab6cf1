"""A real DNS server for tests: Debian's dnsmasq (package dnsmasq-base, /usr/sbin/dnsmasq) on loopback.

    from support.dnsmasq import Dnsmasq

    with Dnsmasq(tmp_path) as dns:                          # answers for *.tfs.test on 127.0.0.1:dns.port
        dns.set_hosts({"pods.tfs.test": ["127.0.0.2", "127.0.0.3"]})   # addn-hosts file + SIGHUP
        dns.set_srv([("_grpc._tcp.pods.tfs.test", "a-0.pods.tfs.test", 8500)])   # config + restart
        dns.server                                           # "127.0.0.1:PORT", for discovery.dns_server
        dns.kill(); dns.start()                              # an outage, then the same port again

Records live in two files the test writes: A/AAAA records in an ``addn-hosts`` file, which
dnsmasq re-reads on SIGHUP, and SRV records (``srv-host=``) in its config file, which it reads
only at start, so changing them restarts dnsmasq on the same port. Names under ``tfs.test``
that have no record answer NXDOMAIN (``local=/tfs.test/``); nothing is forwarded upstream.

dnsmasq cannot report a port it picked, so the port comes from the OS (bind 127.0.0.1:0 for
UDP, read it, close it). If another process takes it in between, dnsmasq exits with "Address
in use" and is started again on a new port (up to three times), before any client has it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import dns.exception
import dns.resolver

DNSMASQ = os.environ.get("TFSCACHE_TEST_DNSMASQ", shutil.which("dnsmasq") or "/usr/sbin/dnsmasq")
DOMAIN = "tfs.test"
PROBE = f"dnsmasq-ready.{DOMAIN}"  # a record that is always there: "is it answering?"


class DnsmasqStartError(RuntimeError):
    """dnsmasq exited or did not answer; the message carries its log."""


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Dnsmasq:
    """One dnsmasq serving the records the test writes."""

    def __init__(self, directory: Path, start_timeout_s: float = 10.0, *, address: str = "127.0.0.1",
                 port: int = 0, wrap=None) -> None:
        """``address``/``port``: where it listens (port 0: one the OS reports free); ``wrap(argv)``: the
        command that runs it (tests/support/netns: ``ip netns exec NS ...``)."""
        self.directory = Path(directory)
        self.address, self.wrap = address, wrap or (lambda argv: argv)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hosts_path = self.directory / "hosts"
        self.conf_path = self.directory / "dnsmasq.conf"
        self.log_path = self.directory / "dnsmasq.log"
        self.start_timeout_s = start_timeout_s
        self.port = port
        self.process: subprocess.Popen | None = None
        self._hosts: dict[str, list[str]] = {}
        self._srv: list[tuple[str, str, int]] = []
        self._generation = 0  # of the hosts file (its probe record)
        self._write_hosts()

    @property
    def server(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- records -------------------------------------------------------------------------------

    @property
    def srv_records(self) -> list[tuple[str, str, int]]:
        return list(self._srv)

    def reset(self) -> None:
        """No records, and running (a test may have killed it)."""
        self._srv = []
        self.set_hosts({})
        self.stop()
        self.start()

    def set_hosts(self, hosts: Mapping[str, Iterable[str]]) -> None:
        """Replace every A/AAAA record (name -> addresses) and make dnsmasq re-read them (SIGHUP);
        returns once it answers from the new file (dnsmasq handles the signal in its own time)."""
        self._hosts = {name: list(addresses) for name, addresses in hosts.items()}
        self._write_hosts()
        if self.alive:
            self.process.send_signal(signal.SIGHUP)
            self._wait_answering(self._generation_probe())

    def set_srv(self, records: Iterable[tuple[str, str, int]]) -> None:
        """Replace every SRV record ((name, target, port), priority 0) and restart dnsmasq on its port."""
        self._srv = list(records)
        if self.alive:
            self.stop()
            self.start()

    def _generation_probe(self) -> str:
        """A record only this version of the hosts file has: answered means the file was read."""
        return f"gen-{self._generation}.{PROBE}"

    def _write_hosts(self) -> None:
        self._generation += 1
        lines = ["127.0.0.1 " + PROBE, "127.0.0.1 " + self._generation_probe()] + [
            f"{address} {name}" for name, addresses in self._hosts.items() for address in addresses]
        tmp = self.hosts_path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.hosts_path)  # SIGHUP never reads a half-written file

    def _write_conf(self) -> None:
        lines = [f"port={self.port}", f"listen-address={self.address}", "bind-interfaces", "no-resolv", "no-hosts",
                 "keep-in-foreground", "log-facility=-", "pid-file=", f"local=/{DOMAIN}/",
                 f"addn-hosts={self.hosts_path}"]
        if os.geteuid() == 0:
            lines.append("user=root")  # keep reading the test's files after SIGHUP (it drops to nobody)
        lines += [f"srv-host={name},{target},{port},0,10" for name, target, port in self._srv]
        self.conf_path.write_text("\n".join(lines) + "\n")

    # -- process -------------------------------------------------------------------------------

    def start(self) -> Dnsmasq:
        """Start (again, on the same port once it has one); returns once it answers."""
        for attempt in range(1 if self.port else 3):
            self.port = self.port or free_udp_port()
            self._write_conf()
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(self.wrap([DNSMASQ, f"--conf-file={self.conf_path}"]), stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                self._wait_answering()
                return self
            except DnsmasqStartError:
                self.kill()
                if "in use" not in self.log() or attempt == 2:
                    raise
                self.port = 0
        raise DnsmasqStartError(f"dnsmasq could not bind {self.server}\n{self.log()}")

    def _wait_answering(self, probe: str = PROBE) -> None:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = [self.address], self.port
        resolver.cache = None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if not self.alive:
                raise DnsmasqStartError(f"dnsmasq exited with {self.process.returncode}\n{self.log()}")
            try:
                resolver.resolve(probe, "A", lifetime=0.1)
                return
            except dns.exception.DNSException:
                if time.monotonic() > deadline:
                    raise DnsmasqStartError(f"dnsmasq did not answer within {self.start_timeout_s} s\n"
                                            f"{self.log()}") from None
                time.sleep(0.05)  # polling a condition with a deadline

    def stop(self) -> None:
        """SIGTERM (a clean stop)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL (an outage)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.alive:
            self.process.send_signal(sig)
        if self.process is not None:
            self.process.wait(timeout=30)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def __enter__(self) -> Dnsmasq:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()
