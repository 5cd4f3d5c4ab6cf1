"""A tfscache sidecar cluster on loopback: real ``tfscache node`` processes, each with its own
``tfscache serve --node-address ...`` sidecar as a real process, through one discovery backend.

    cluster = Cluster(tmp, repo, registry)            # registry: Static, Consul (fake) or Etcd (real)
    cluster.add("a"); cluster.add("b"); cluster.add("c")
    cluster.wait_rings(["a", "b", "c"])               # every live sidecar's ring, read from /status
    with Traffic(cluster, models) as traffic: ...     # steady requests; traffic.failures must stay []

Sidecars run with ``ring.replicas_per_model = 2`` (as deploy/k8s does), short discovery
TTLs (Consul 1.5 s, etcd 2 s: etcd's floor), admin and metrics ports on 127.0.0.1:0, read
back from the ports file. The fake Consul (tests/fakes/consul.py) runs in its own thread
with its own event loop, so the tests are plain synchronous code and a blocking call in a
test never stalls the registry the sidecars talk to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from fakes.consul import FakeConsul
from support.serving import link_repository
from support.requests import predict_request
from support.etcd import EtcdCluster
from support.node import PYTHON, REPO, NodeProcess, start_node
from support.waiting import wait_until
from tfscache.admin.client import AdminClient

EMPTY = "model_config_list {\n}\n"
NODE_FLAGS = ["--max_num_load_retries=0", "--num_load_threads=2"]
MODELS = [f"addk_{k}" for k in range(1, 13)]  # y = x + k: every answer names the model that computed it
REPLICAS = 2
BACKENDS = ["static", "consul", "etcd"]


# -- registries ---------------------------------------------------------------------------------


class Static:
    """No registry: each sidecar's config file lists the peers; SIGHUP re-reads it."""

    name = "static"
    ttl_s = 0.0

    def options(self) -> dict:
        return {"backend": "static"}

    def close(self) -> None:
        pass


class Consul:
    """The fake Consul agent (tests/fakes/consul.py) on its own event loop in a thread."""

    name = "consul"
    ttl_s = 1.5

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-consul", daemon=True)
        self.thread.start()
        self.fake = self._call(self._make())
        self._call(self.fake.start())

    @staticmethod
    async def _make() -> FakeConsul:
        return FakeConsul()  # its asyncio objects belong to this loop

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self._call(self.fake.stop())

    def start(self) -> None:
        self._call(self.fake.start())

    def options(self) -> dict:
        return {"backend": "consul", "consul_address": self.fake.url, "ttl_s": self.ttl_s,
                "consul_wait_s": 5.0}

    def close(self) -> None:
        self._call(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Etcd:
    """A real 3-member etcd on loopback (tests/support/etcd.py)."""

    name = "etcd"
    ttl_s = 2.0

    def __init__(self, directory: Path) -> None:
        self.cluster = EtcdCluster(directory, size=3).start()

    def options(self) -> dict:
        return {"backend": "etcd", "etcd_endpoints": self.cluster.endpoints, "ttl_s": self.ttl_s}

    def close(self) -> None:
        self.cluster.close()


# -- sidecars -----------------------------------------------------------------------------------


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def write_config(path: Path, sections: dict[str, dict], top: dict) -> None:
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for section, values in sections.items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)  # a SIGHUP never reads half a file


@dataclass
class Sidecar:
    name: str
    node: NodeProcess
    directory: Path
    config: Path
    process: subprocess.Popen | None = None
    ports: dict = field(default_factory=dict)

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def admin_target(self) -> str:
        return f"127.0.0.1:{self.ports['admin']}"

    def peer(self) -> dict:
        return {"name": self.name, "grpc": self.grpc_target, "rest": f"127.0.0.1:{self.ports['rest']}"}

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/status", timeout=10) as reply:
            return json.loads(reply.read())

    def ring(self) -> list[str]:
        return self.status()["ring"]["nodes"]

    def counts(self) -> tuple[int, int]:
        doc = self.status()
        return doc["hits"], doc["misses"]

    def resident(self) -> set[str]:
        with AdminClient(self.admin_target, timeout_s=30) as admin:
            return {m.name for n in admin.list_models().nodes for m in n.models if m.state == "available"}

    def log(self) -> str:
        return (self.directory / "serve.log").read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    """Sidecars (each with its own node) of one discovery backend."""

    def __init__(self, directory: Path, repository: Path, registry) -> None:
        self.directory, self.repository, self.registry = directory, repository, registry
        self.sidecars: dict[str, Sidecar] = {}

    def live(self) -> list[Sidecar]:
        return [s for s in self.sidecars.values() if s.alive]

    def add(self, name: str, join: bool = True, peers: list[dict] | None = None) -> Sidecar:
        """A new node and its sidecar; ``join=False``: started with ``--no-join`` (off the ring until Join)."""
        directory = self._make_dir(name)
        node = start_node(directory, config=EMPTY, flags=NODE_FLAGS)
        sidecar = Sidecar(name, node, directory, directory / "tfscache.toml")
        self.sidecars[name] = sidecar
        self.start(sidecar, join, peers)
        return sidecar

    def add_all(self, names: list[str]) -> None:
        """Nodes and sidecars ``names``, started concurrently (nodes first, then their sidecars):
        each start mostly waits on its own process, so the cluster forms in the time of the slowest."""
        with ThreadPoolExecutor(len(names)) as pool:
            started = [pool.submit(start_node, self._make_dir(name), config=EMPTY, flags=NODE_FLAGS)
                       for name in names]
            wait(started)
            for name, future in zip(names, started):
                if future.exception() is None:
                    directory = self.directory / name
                    self.sidecars[name] = Sidecar(name, future.result(), directory, directory / "tfscache.toml")
            for future in started:
                future.result()  # a node that failed to start fails the fixture; close() stops the rest
            for future in [pool.submit(self.start, self.sidecars[name]) for name in names]:
                future.result()

    def _make_dir(self, name: str) -> Path:
        directory = self.directory / name
        directory.mkdir(parents=True)
        return directory

    def start(self, sidecar: Sidecar, join: bool = True, peers: list[dict] | None = None) -> None:
        """Start (or restart) ``sidecar``'s ``tfscache serve``; its state dir is kept across restarts."""
        node = sidecar.node
        discovery = self.registry.options()
        discovery.update(retry_max_s=0.5, start_timeout_s=20.0)
        if discovery["backend"] == "static":
            # The sidecar must be in its own list; its own address is never used (set_peers skips it).
            peers = peers or [{"name": sidecar.name, "grpc": "127.0.0.1:1"}]
        ring = {"self_name": sidecar.name, "replicas_per_model": REPLICAS}
        if peers is not None:
            ring["peers"] = peers
        write_config(sidecar.config, {
            "node": {"node_address": f"127.0.0.1:{node.grpc_port},{node.rest_port}",
                     "state_dir": str(sidecar.directory / "state")},
            "ring": ring,
            "server": {"bind_address": "127.0.0.1", "grpc_port": 0, "rest_port": 0, "admin_port": 0,
                       "metrics_port": 0, "grace_s": 1.0, "ports_file": str(sidecar.directory / "ports.json")},
            "discovery": discovery,
        }, {"model_repository": str(self.repository)})
        ports_file = sidecar.directory / "ports.json"
        ports_file.unlink(missing_ok=True)
        with open(sidecar.directory / "serve.log", "ab") as log:
            sidecar.process = subprocess.Popen(
                [PYTHON, "-m", "tfscache", "serve", "--config", str(sidecar.config), *([] if join else ["--no-join"])],
                stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_until(lambda: ports_file.exists() or sidecar.process.poll() is not None, 60,
                   f"sidecar {sidecar.name} to serve")
        if sidecar.process.poll() is not None:
            raise AssertionError(f"sidecar {sidecar.name} exited {sidecar.process.returncode}:\n"
                                 f"{sidecar.log()[-4000:]}")
        sidecar.ports = json.loads(ports_file.read_text())

    def set_static_peers(self, names: list[str]) -> None:
        """Static discovery: write the list ``names`` into every live sidecar's file, then SIGHUP them."""
        peers = [self.sidecars[n].peer() for n in names]
        for sidecar in self.live():
            text = sidecar.config.read_text()
            start = text.index("\n[ring]")
            end = text.index("\n[", start + 1)
            ring = {"self_name": sidecar.name, "replicas_per_model": REPLICAS, "peers": peers}
            new = text[:start] + "\n[ring]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in ring.items()) + text[end:]
            tmp = sidecar.config.with_name("tfscache.toml.tmp")
            tmp.write_text(new)
            os.replace(tmp, sidecar.config)
            sidecar.process.send_signal(signal.SIGHUP)

    def wait_rings(self, names: list[str], timeout: float = 30.0, among: list[Sidecar] | None = None) -> None:
        """Until every live sidecar (or those in ``among``) has exactly ``names`` on its ring."""
        chosen = among if among is not None else self.live()
        wait_until(lambda: all(s.ring() == sorted(names) for s in chosen), timeout,
                   f"rings {sorted(names)} (have {[(s.name, s.ring()) for s in chosen]})",
                   interval=0.05)

    def close(self) -> None:
        for sidecar in self.sidecars.values():
            if sidecar.alive:
                sidecar.process.send_signal(signal.SIGTERM)
        for sidecar in self.sidecars.values():
            if sidecar.process is not None:
                try:
                    sidecar.process.wait(30)
                except subprocess.TimeoutExpired:
                    sidecar.process.kill()
                    sidecar.process.wait()
            sidecar.node.stop()


# -- clients ------------------------------------------------------------------------------------


class Client:
    """Blocking Predict calls to sidecars, one channel per target."""

    def __init__(self) -> None:
        self.channels: dict[str, grpc.Channel] = {}

    def predict(self, target: str, name: str, x: float) -> list[float]:
        channel = self.channels.get(target)
        if channel is None:
            channel = self.channels[target] = grpc.insecure_channel(target)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return list(stub.Predict(predict_request(name, x), timeout=60).outputs["y"].float_val)

    def check(self, target: str, name: str, x: float = 1.0) -> None:
        assert self.predict(target, name, x) == [x + int(name.split("_")[1])], (target, name)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


class Traffic:
    """Steady requests from a thread, round-robin over the client's targets and the models.

    ``targets`` is what a client's load balancer would pick from: tests take a sidecar out
    of it before killing or draining it (as a Service drops a pod whose readiness fails).
    Every answer is checked (y = x + k); each failure is kept with its gRPC code.
    """

    def __init__(self, targets: list[str], models: list[str] = MODELS) -> None:
        self.targets = list(targets)
        self.models = models
        self.client = Client()
        self.sent = 0
        self.failures: list[tuple[str, str, str]] = []  # (target, model, what happened, with the time)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def remove(self, target: str) -> None:
        """Stop calling ``target``; returns once no request to it is in flight any more."""
        with self._lock:
            self.targets.remove(target)
            sent = self.sent
        if self._thread.is_alive():  # the request in flight now may be to target: let it finish
            wait_until(lambda: self.sent > sent, 60, "the request in flight")

    def add(self, target: str) -> None:
        with self._lock:
            self.targets.append(target)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            with self._lock:
                target = self.targets[i % len(self.targets)]
            name = self.models[(i // len(self.targets) + i) % len(self.models)]
            x = float(i % 100)
            started = time.strftime("%H:%M:%S")
            try:
                got = self.client.predict(target, name, x)
                if got != [x + int(name.split("_")[1])]:
                    self.failures.append((target, name, f"wrong answer {got} (sent {started})"))
            except grpc.RpcError as exc:
                self.failures.append((target, name, f"{exc.code().name}: {exc.details()} (sent {started})"))
            with self._lock:
                self.sent += 1
            i += 1

    def wait_sent(self, more: int, timeout: float = 60.0) -> None:
        """Until ``more`` further requests have been answered (or failed)."""
        target = self.sent + more
        wait_until(lambda: self.sent >= target, timeout, f"{more} more requests")

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(90)
        self.client.close()


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cluster_repo(synthetic_models, tmp_path_factory):
    ks = [int(m.split("_")[1]) for m in MODELS]
    return link_repository(tmp_path_factory.mktemp("cluster") / "models", synthetic_models(ks))


@pytest.fixture(scope="module", params=BACKENDS)
def registry(request, tmp_path_factory):
    if request.param == "static":
        reg = Static()
    elif request.param == "consul":
        reg = Consul()
    else:
        reg = Etcd(tmp_path_factory.mktemp("etcd"))
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def cluster(registry, cluster_repo, tmp_path_factory):
    """Sidecars a, b, c (each with its node) that have formed a ring; shared by a module's tests in order."""
    c = Cluster(tmp_path_factory.mktemp(f"cluster-{registry.name}"), cluster_repo, registry)
    try:
        c.add_all(["a", "b", "c"])
        if registry.name == "static":
            c.set_static_peers(["a", "b", "c"])
        yield c
    finally:
        c.close()
