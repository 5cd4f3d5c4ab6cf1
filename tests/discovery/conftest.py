"""Backends for the discovery tests: static (a TOML file), consul (the FAKE agent), etcd (real).

``harness`` is parametrized over every backend; ``dynamic_harness`` over the ones where
sidecars register themselves (consul, etcd). A harness makes Discovery objects wired to
its backend with short TTLs and stops them all at teardown. Each test gets its own
service name (consul) or key prefix (etcd), so tests sharing the module's etcd do not see
each other.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

import pytest

from fakes.consul import FakeConsul
from support.etcd import EtcdCluster
from tfscache.discovery import Discovery, Peer
from tfscache.discovery.consul import ConsulDiscovery
from tfscache.discovery.etcd import EtcdDiscovery
from tfscache.discovery.static import StaticDiscovery

WAIT_S = 15.0  # longest wait for any expected change; a hang fails the test instead of sleeping
FAST_RETRY = {"retry_initial_s": 0.05, "retry_max_s": 0.5, "start_timeout_s": 10.0}
_ports = itertools.count(20000, 2)
_PEER_PORTS: dict[str, int] = {}


def peer(name: str) -> Peer:
    """A sidecar's address pair; nothing listens there (discovery only passes addresses on)."""
    port = _PEER_PORTS.setdefault(name, next(_ports))
    return Peer(name, f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}")


def names(members: list[Peer]) -> set[str]:
    return {p.name for p in members}


class Harness(ABC):
    """Makes Discovery objects for one backend; ``ttl_s`` is the TTL its dynamic backends use."""

    name = ""
    ttl_s = 0.0

    def __init__(self) -> None:
        self.made: list[Discovery] = []

    def make(self, **options) -> Discovery:
        discovery = self._make(**options)
        self.made.append(discovery)
        return discovery

    @abstractmethod
    def _make(self, **options) -> Discovery:
        """A new, unstarted Discovery of this harness's backend."""

    async def close(self) -> None:
        for discovery in self.made:
            await discovery.stop()

    async def form(self, names_: tuple[str, ...] = ("a", "b", "c"), **options) -> dict[str, Discovery]:
        """Start and register one Discovery per name; returns once each sees all of them."""
        made = {name: self.make(**options) for name in names_}
        for name, discovery in made.items():
            await discovery.start()
            await discovery.register(peer(name))
        for discovery in made.values():
            await discovery.wait_for(lambda m: names(m) == set(names_), WAIT_S)
        return made


class StaticHarness(Harness):
    name = "static"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.config = directory / "tfscache.toml"
        self.write(["a", "b", "c"])

    def write(self, names_: list[str]) -> None:
        lines = [f'{{name = "{p.name}", grpc = "{p.grpc}", rest = "{p.rest}"}}' for p in map(peer, names_)]
        self.config.write_text('model_repository = "/models"\n[ring]\nself_name = "a"\n'
                               f"peers = [{', '.join(lines)}]\n")

    def _make(self, **options) -> Discovery:
        options.pop("ttl_s", None)
        return StaticDiscovery(config_file=self.config, **{**FAST_RETRY, **options})


class ConsulHarness(Harness):
    name = "consul"
    ttl_s = 1.5

    def __init__(self, consul: FakeConsul) -> None:
        super().__init__()
        self.consul = consul
        self.service = f"tfscache-{uuid.uuid4().hex[:8]}"

    def _make(self, **options) -> Discovery:
        defaults = {"address": self.consul.url, "service": self.service, "ttl_s": self.ttl_s, "wait_s": 5.0,
                    "request_timeout_s": 2.0, **FAST_RETRY}
        return ConsulDiscovery(**{**defaults, **options})

    async def outage(self) -> None:
        await self.consul.stop()

    async def recover(self) -> None:
        await self.consul.start()


class EtcdHarness(Harness):
    name = "etcd"
    ttl_s = 2.0  # etcd's smallest lease with default timings (1.5 s rounded up)

    def __init__(self, cluster: EtcdCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.prefix = f"/tfscache-test-{uuid.uuid4().hex[:8]}"
        self._rotation = itertools.count()

    def _make(self, **options) -> Discovery:
        # Each Discovery starts at a different member, so a killed member is some sidecar's current one.
        n = next(self._rotation) % len(self.cluster.endpoints)
        endpoints = self.cluster.endpoints[n:] + self.cluster.endpoints[:n]
        defaults = {"endpoints": endpoints, "prefix": self.prefix, "ttl_s": self.ttl_s,
                    "request_timeout_s": 2.0, **FAST_RETRY}
        return EtcdDiscovery(**{**defaults, **options})

    async def outage(self) -> None:
        for i in range(len(self.cluster.members)):
            self.cluster.kill(i)

    async def recover(self) -> None:
        for i in range(len(self.cluster.members)):
            self.cluster.restart(i, wait=False)
        await asyncio.to_thread(self.cluster.wait_healthy)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory):
    """One real single-member etcd for the module."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), size=1) as cluster:
        yield cluster


@pytest.fixture
def etcd3(tmp_path: Path):
    """A real 3-member etcd cluster on loopback, for one fault test."""
    with EtcdCluster(tmp_path / "etcd3", size=3) as cluster:
        yield cluster


@pytest.fixture
async def fake_consul():
    consul = FakeConsul()
    await consul.start()
    yield consul
    await consul.stop()


async def _harness(kind: str, request: pytest.FixtureRequest, tmp_path: Path):
    if kind == "static":
        yield StaticHarness(tmp_path)
        return
    if kind == "etcd":
        harness = EtcdHarness(request.getfixturevalue("etcd"))  # a sync fixture: safe from here
        yield harness
        await harness.close()
        return
    consul = FakeConsul()
    await consul.start()
    harness = ConsulHarness(consul)
    yield harness
    await harness.close()
    await consul.stop()


@pytest.fixture(params=["static", "consul", "etcd"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path):
    async for h in _harness(request.param, request, tmp_path):
        yield h


@pytest.fixture(params=["consul", "etcd"])
async def dynamic_harness(request: pytest.FixtureRequest, tmp_path: Path):
    async for h in _harness(request.param, request, tmp_path):
        yield h
