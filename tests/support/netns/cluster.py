"""A tfscache cluster of hosts that are network namespaces: each host a ``tfscache node`` and its
``tfscache serve`` sidecar, discovery by a real etcd or a real DNS server (dnsmasq) in a namespace
of its own, and clients in another.

    with NetCluster(tmp, repo, models, backend="etcd") as cluster:       # or backend="dns"
        cluster.add("a"); cluster.add("b"); cluster.add("c", proxied=True)
        cluster.wait_rings(["a", "b", "c"])
        with cluster.traffic(["a", "b"]) as traffic: ...                 # 16 clients in namespace "clients"
        cluster.hosts["a"].net.cut()                                     # tests/support/netns.Host
        cluster.discovery.net.cut()                                      # etcd and DNS unreachable

Every host serves on fixed ports of its own address (gRPC 8500, REST 8501, admin 8502 with a
token, metrics/status 8503; its node on 127.0.0.1:9000/9001 inside the namespace, forked from the
session's node template by forknode.py, so it imports no TensorFlow of its own). A
``proxied`` host's sidecar binds 127.0.0.1 and a user-space delay proxy (delayproxy.py) serves
its address, so ``slow(delay)`` delays everything that reaches it (this kernel has no netem).
With ``backend="dns"`` the test is Kubernetes' endpoints controller: ``publish`` writes the
SRV/A records of the hosts that are ready (``_grpc._tcp.pods.tfs.test`` and ``_rest._tcp``).
A ``Monitor`` thread reads every reachable host's resident models (admin ListModels) and ring
(``/status``) every ``interval`` seconds, for the figures of tests/support/netns/report.py.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dns.exception
import dns.resolver

from support.dnsmasq import Dnsmasq
from support.etcd import ETCD
from support.netns import Host as NetHost
from support.netns import Network
from support.node import PYTHON, node_template
from support.process import REPO, wait_for_ports
from support.waiting import wait_until
from tfscache.admin.client import AdminClient, AdminError

GRPC, REST, ADMIN, METRICS = 8500, 8501, 8502, 8503
NODE_GRPC, NODE_REST = 9000, 9001
TOKEN = "netns-test-token"
DOMAIN = "pods.tfs.test"
HERE = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def write_config(path: Path, top: dict, sections: dict[str, dict]) -> None:
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for section, values in sections.items():
        lines += [f"\n[{section}]", *(f"{k} = {_toml(v)}" for k, v in values.items())]
    path.write_text("\n".join(lines) + "\n")


class StartError(RuntimeError):
    def __init__(self, message: str, returncode, log: str) -> None:
        super().__init__(f"{message}\n--- log ---\n{log[-4000:]}")


class Discovery:
    """etcd (one member) and dnsmasq (port 53) in namespace ``disc``: one link to cut for an outage."""

    def __init__(self, net: NetHost, directory: Path) -> None:
        self.net, self.directory = net, directory
        self.etcd: subprocess.Popen | None = None
        self.dns = Dnsmasq(directory / "dns", address=net.address, port=53, wrap=net.command)

    @property
    def etcd_url(self) -> str:
        return f"http://{self.net.address}:2379"

    def start(self) -> None:
        data = self.directory / "etcd.data"
        self.etcd = self.net.popen([
            ETCD, "--name", "e0", "--data-dir", str(data), "--listen-client-urls", self.etcd_url,
            "--advertise-client-urls", self.etcd_url, "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--initial-cluster", "e0=http://127.0.0.1:2380",
            "--initial-cluster-state", "new", "--log-level", "warn"], self.directory / "etcd.log")
        self.dns.start()
        wait_until(self.etcd_healthy, 30, "etcd to be healthy", interval=0.05)

    def etcd_healthy(self) -> bool:
        if self.etcd.poll() is not None:
            raise StartError("etcd exited", self.etcd.returncode, (self.directory / "etcd.log").read_text())
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=1) as reply:
                return json.loads(reply.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def registered(self) -> int:
        """How many hosts the registry lists now: etcd keys under the prefix, and SRV records; -1 if unreachable."""
        try:
            request = urllib.request.Request(
                self.etcd_url + "/v3/kv/range", method="POST", data=json.dumps({
                    "key": base64.b64encode(b"/tfscache/tfscache/").decode(),
                    "range_end": base64.b64encode(b"/tfscache/tfscache0").decode(), "count_only": True}).encode())
            with urllib.request.urlopen(request, timeout=1) as reply:
                keys = int(json.loads(reply.read()).get("count", 0))
            resolver = dns.resolver.Resolver(configure=False)
            resolver.nameservers, resolver.port, resolver.cache = [self.net.address], 53, None
            try:
                records = len(resolver.resolve(f"_grpc._tcp.{DOMAIN}", "SRV", lifetime=1))
            except dns.resolver.NXDOMAIN:
                records = 0
            return max(keys, records)
        except (OSError, ValueError, dns.exception.DNSException):
            return -1

    def publish(self, hosts: dict[str, str]) -> None:
        """The DNS records of ``hosts`` ({name: address}): what a headless Service lists for its ready pods."""
        self.dns._hosts = {f"{name}.{DOMAIN}": [address] for name, address in hosts.items()}
        self.dns._write_hosts()
        records = [(f"_{kind}._tcp.{DOMAIN}", f"{name}.{DOMAIN}", port)
                   for name in sorted(hosts) for kind, port in (("grpc", GRPC), ("rest", REST))]
        self.dns.set_srv(records)  # SRV records are read at start only: a restart on port 53


class ClusterHost:
    """One host: a namespace with a node, a sidecar and, if proxied, a delay proxy in front."""

    def __init__(self, cluster: NetCluster, net: NetHost, proxied: bool) -> None:
        self.cluster, self.net, self.name, self.proxied = cluster, net, net.name, proxied
        self.directory = cluster.directory / net.name
        self.directory.mkdir(parents=True, exist_ok=True)
        self.node: subprocess.Popen | None = None
        self.sidecar: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.killed = False

    @property
    def address(self) -> str:
        return self.net.address

    def start(self, join: bool = True) -> None:
        self.killed = False
        ports = self.directory / "node.ports.json"
        ports.unlink(missing_ok=True)
        (self.directory / "models.config").write_text("model_config_list {\n}\n")
        log = self.directory / "node.log"
        self.node = self.net.popen([  # forked from the session's template, in this namespace
            PYTHON, str(HERE / "forknode.py"), node_template(), "node", f"--port={NODE_GRPC}",
            f"--rest_api_port={NODE_REST}",
            "--bind_address=127.0.0.1", f"--ports_file={ports}", "--file_system_poll_wait_seconds=0.1",
            f"--model_config_file={self.directory / 'models.config'}", "--max_num_load_retries=0",
            "--num_load_threads=2"], log, ENV, REPO)
        wait_for_ports(self.node, ports, log, 240, StartError)
        self.start_sidecar(join)

    def start_sidecar(self, join: bool = True) -> None:
        """Its delay proxy (if proxied) and ``tfscache serve`` in front of its running node."""
        bind = self.address
        if self.proxied:
            bind = "127.0.0.1"
            ready = self.directory / "proxy.ready"
            ready.unlink(missing_ok=True)
            if self.proxy is not None and self.proxy.poll() is None:
                self.proxy.kill()
                self.proxy.wait()
            self.proxy = self.net.popen([
                PYTHON, str(HERE / "delayproxy.py"), "--listen", self.address,
                *(f"--forward={p}=127.0.0.1:{p}" for p in (GRPC, REST, ADMIN, METRICS)),
                f"--delayed={GRPC},{REST}", f"--delay-file={self.directory / 'delay'}",
                f"--ready-file={ready}"], self.directory / "proxy.log", ENV, REPO)
            wait_until(lambda: ready.exists() or self.proxy.poll() is not None, 30, "the delay proxy")
        config = self.directory / "tfscache.toml"
        write_config(config, {"model_repository": str(self.cluster.repository)}, {
            "node": {"node_address": f"127.0.0.1:{NODE_GRPC},{NODE_REST}", "state_dir": str(self.directory / "state")},
            "ring": {"self_name": self.name, "replicas_per_model": self.cluster.replicas},
            "cache": {"max_models_per_node": self.cluster.cap},
            "server": {"bind_address": bind, "grpc_port": GRPC, "rest_port": REST, "admin_port": ADMIN,
                       "admin_bind_address": bind, "admin_token": TOKEN, "metrics_port": METRICS,
                       "grace_s": 1.0, "ports_file": str(self.directory / "serve.ports.json")},
            "discovery": {**self.cluster.discovery_options(), "advertise_host": self.address},
        })
        ports = self.directory / "serve.ports.json"
        ports.unlink(missing_ok=True)
        self.sidecar = self.net.popen([PYTHON, "-m", "tfscache", "serve", "--config", str(config),
                                       *([] if join else ["--no-join"])], self.directory / "serve.log", ENV, REPO)
        wait_for_ports(self.sidecar, ports, self.directory / "serve.log", 240, StartError)

    def slow(self, delay: float) -> None:
        """Delay everything that reaches its gRPC and REST ports by ``delay`` seconds (proxied hosts)."""
        (self.directory / "delay").write_text(f"{delay}\n")
        self.proxy.send_signal(signal.SIGHUP)

    def admin(self, timeout_s: float = 5.0) -> AdminClient:
        return AdminClient(f"{self.address}:{ADMIN}", token=TOKEN, timeout_s=timeout_s)

    def status(self, timeout: float = 2.0) -> dict:
        request = urllib.request.Request(f"http://{self.address}:{METRICS}/status",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())

    def ring(self) -> list[str]:
        return self.status()["ring"]["nodes"]

    def models(self, timeout_s: float = 2.0) -> dict[str, tuple[str, bool]]:
        """{model name: (state, pinned)} on its node."""
        with self.admin(timeout_s) as admin:
            return {m.name: (m.state, m.pinned) for n in admin.list_models().nodes for m in n.models}

    def log(self) -> str:
        return (self.directory / "serve.log").read_text(errors="replace")

    def kill(self) -> list[int]:
        """The whole host dies: every process in its namespace SIGKILLed at once."""
        self.killed = True
        return self.net.kill_all()


class Traffic:
    """The client program (clients.py) running in the clients' namespace; results read from its file."""

    def __init__(self, cluster: NetCluster, targets: list[str], clients: int, deadline: float, alpha: float,
                 seed: int) -> None:
        self.cluster = cluster
        self.targets_file = cluster.directory / f"targets-{seed}.json"
        self.out = cluster.directory / f"traffic-{seed}.jsonl"
        self.clients, self.generation = clients, 0
        self._write_targets(targets)
        self.out.unlink(missing_ok=True)
        started = self.out.with_suffix(".started")
        started.unlink(missing_ok=True)
        self.process = cluster.clients.popen([
            PYTHON, "-m", "support.netns.clients", "--targets", str(self.targets_file), "--out", str(self.out),
            "--models", ",".join(cluster.models), "--clients", str(clients), "--alpha", str(alpha),
            "--deadline", str(deadline), "--seed", str(seed)], cluster.directory / "clients.log",
            ENV, REPO / "tests")
        wait_until(lambda: started.exists() or self.process.poll() is not None, 120, "the clients to start")
        if self.process.poll() is not None:
            raise StartError("the clients exited", self.process.returncode,
                             (cluster.directory / "clients.log").read_text())

    def set_targets(self, names: list[str], timeout: float = 60.0) -> None:
        """What the clients' load balancer picks from (a Service's ready endpoints). Returns once
        every client has finished a request sent to ``names``: none is still in flight to a host
        dropped from them, so a fault injected next meets only the requests it should."""
        self._write_targets(names)
        generation = self.generation

        def switched() -> bool:
            return len({r["w"] for r in self.results() if r["g"] >= generation}) >= self.clients

        wait_until(switched, timeout, f"every client to send to {names}", interval=0.1)

    def _write_targets(self, names: list[str]) -> None:
        self.generation += 1
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"generation": self.generation,
                                   "addresses": [self.cluster.hosts[n].address for n in names]}))
        os.replace(tmp, self.targets_file)

    def results(self) -> list[dict]:
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line being written
        return rows

    def wait_requests(self, more: int, timeout: float = 120.0) -> None:
        target = len(self.results()) + more
        wait_until(lambda: len(self.results()) >= target, timeout, f"{more} more requests", interval=0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Traffic:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Monitor:
    """Samples, every ``interval`` s, each live host's ring and models: [(time, {host: sample or None})]."""

    def __init__(self, cluster: NetCluster, interval: float = 0.25) -> None:
        self.cluster, self.interval = cluster, interval
        self.samples: list[tuple[float, dict[str, dict | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netns-monitor", daemon=True)

    def _sample(self, host: ClusterHost) -> dict | None:
        try:
            return {"models": host.models(1.0), "ring": host.ring()}
        except (OSError, ValueError, AdminError, KeyError):
            return None  # unreachable (cut off, killed, slow, starting)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            hosts = [h for h in list(self.cluster.hosts.values()) if not h.killed and h.sidecar is not None]
            self.samples.append((time.time(), {h.name: self._sample(h) for h in hosts}))

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


class NetCluster:
    """The network, the discovery namespace, hosts and the clients' namespace."""

    def __init__(self, directory: Path, repository: Path, models: list[str], backend: str = "etcd",
                 replicas: int = 2, cap: int = 8, ttl_s: float = 3.0) -> None:
        if backend not in ("etcd", "dns"):
            raise ValueError(backend)
        self.directory, self.repository, self.models = Path(directory), Path(repository), models
        self.backend, self.replicas, self.cap, self.ttl_s = backend, replicas, cap, ttl_s
        self.network = Network()
        self.hosts: dict[str, ClusterHost] = {}
        self.published: set[str] = set()
        self.discovery: Discovery | None = None

    def start(self) -> NetCluster:
        self.network.start()
        try:
            self.discovery = Discovery(self.network.host("disc"), self.directory / "disc")
            self.discovery.start()
            self.clients = self.network.host("clients")
        except BaseException:
            self.close()
            raise
        return self

    def discovery_options(self) -> dict:
        common = {"retry_max_s": 0.5, "start_timeout_s": 30.0, "request_timeout_s": 1.0}
        if self.backend == "etcd":
            return {"backend": "etcd", "etcd_endpoints": [self.discovery.etcd_url], "ttl_s": self.ttl_s, **common}
        return {"backend": "dns", "dns_name": DOMAIN, "dns_server": self.discovery.dns.server,
                "dns_interval_s": 0.5, **common}

    def add(self, name: str, *, proxied: bool = False, join: bool = True, publish: bool = True) -> ClusterHost:
        """A new host (namespace, node, sidecar); with dns its records are published once it serves."""
        host = ClusterHost(self, self.network.host(name), proxied)
        self.hosts[name] = host
        host.start(join)
        if publish and self.backend == "dns":
            self.publish(self.published | {name})
        return host

    def add_many(self, names: list[str], proxied: tuple[str, ...] = ()) -> list[ClusterHost]:
        """Several hosts started at once (their nodes and sidecars in parallel)."""
        hosts = [ClusterHost(self, self.network.host(name), name in proxied) for name in names]
        for host in hosts:
            self.hosts[host.name] = host
        with ThreadPoolExecutor(len(hosts)) as pool:
            list(pool.map(lambda h: h.start(), hosts))
        if self.backend == "dns":
            self.publish(self.published | set(names))
        return hosts

    def switch_backend(self, backend: str) -> None:
        """Restart every live sidecar (SIGTERM: it leaves the ring) with discovery by ``backend``;
        the nodes and the sidecars' state directories stay (a cluster started once serves both)."""
        hosts = self.live()
        for host in hosts:
            host.sidecar.send_signal(signal.SIGTERM)
        for host in hosts:
            host.sidecar.wait(60)
        self.backend = backend
        with ThreadPoolExecutor(len(hosts)) as pool:
            list(pool.map(lambda h: h.start_sidecar(), hosts))
        if backend == "dns":
            self.publish({h.name for h in hosts})

    def publish(self, names: set[str]) -> None:
        """dns: the records list exactly ``names`` (the hosts Kubernetes considers ready)."""
        self.published = set(names)
        if self.backend == "dns":
            self.discovery.publish({n: self.hosts[n].address for n in names})

    def live(self) -> list[ClusterHost]:
        return [h for h in self.hosts.values() if not h.killed and h.sidecar is not None
                and h.sidecar.poll() is None]

    def rings(self, among: list[ClusterHost] | None = None) -> dict[str, list[str] | None]:
        out = {}
        for host in among if among is not None else self.live():
            try:
                out[host.name] = host.ring()
            except (OSError, ValueError):
                out[host.name] = None
        return out

    def wait_rings(self, names: list[str], timeout: float = 60.0, among: list[ClusterHost] | None = None) -> float:
        """Until every live host (or those ``among``) has exactly ``names`` on its ring; the seconds it took."""
        start = time.monotonic()
        wait_until(lambda: all(r == sorted(names) for r in self.rings(among).values()), timeout,
                   f"rings {sorted(names)} (have {self.rings(among)})", interval=0.1)
        return time.monotonic() - start

    def traffic(self, targets: list[str], clients: int = 16, deadline: float = 10.0, alpha: float = 1.0,
                seed: int = 1) -> Traffic:
        return Traffic(self, targets, clients, deadline, alpha, seed)

    def close(self) -> None:
        """Every process killed and every namespace, link and the bridge removed (also after a failure)."""
        for host in self.hosts.values():
            if host.sidecar is not None and host.sidecar.poll() is None:
                host.sidecar.send_signal(signal.SIGTERM)
        for host in self.hosts.values():
            if host.sidecar is not None:
                try:
                    host.sidecar.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if getattr(self, "discovery", None) is not None:
            self.discovery.dns.kill()  # its own Popen, reaped here
        self.network.close()

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
