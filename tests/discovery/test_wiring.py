"""from_settings / advertise_peer: what `tfscache serve` calls, with today's settings and the proposed section."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tfscache import settings as settings_mod
from tfscache.discovery import Peer, advertise_peer, from_settings
from tfscache.discovery.consul import ConsulDiscovery
from tfscache.discovery.etcd import EtcdDiscovery
from tfscache.discovery.static import StaticDiscovery
from tfscache.cluster.ring import Ring

from .conftest import StaticHarness, names


def _proposed(backend: str, **overrides) -> SimpleNamespace:
    """Settings with the [discovery] section docs/discovery.md proposes."""
    section = dict(backend=backend, service_name="tfscache", advertise_host="", ttl_s=10.0, retry_max_s=5.0,
                   start_timeout_s=30.0, request_timeout_s=5.0, consul_address="http://127.0.0.1:8500",
                   consul_token="", consul_wait_s=30.0, consul_deregister_critical_after_s=600.0,
                   etcd_endpoints=["http://127.0.0.1:2379"], etcd_prefix="/tfscache")
    section.update(overrides)
    return SimpleNamespace(discovery=SimpleNamespace(**section), ring=SimpleNamespace(peers=[], self_name="a"),
                           server=SimpleNamespace(bind_address="0.0.0.0"))


async def test_static_from_todays_settings_and_sighup_reload(tmp_path) -> None:
    harness = StaticHarness(tmp_path)
    (tmp_path / "models").mkdir()
    text = harness.config.read_text().replace('"/models"', f'"{tmp_path / "models"}"')
    harness.config.write_text(text.replace("[ring]", '[node]\nnode_address = "127.0.0.1:9000"\n[ring]'))
    settings = settings_mod.load(harness.config, env={})
    discovery = from_settings(settings, config_file=harness.config)
    assert isinstance(discovery, StaticDiscovery)
    ring = Ring(replicas=1)
    discovery.subscribe(lambda members: [ring.add(p.name) for p in members])  # as serve's set_peers would
    await discovery.start()
    assert ring.nodes == ["a", "b", "c"]
    harness.write(["a", "b", "c", "d"])
    assert await discovery.reload()
    assert ring.nodes == ["a", "b", "c", "d"] and names(discovery.members()) == set("abcd")


def test_the_proposed_section_picks_and_configures_backends() -> None:
    consul = from_settings(_proposed("consul", consul_token="t", consul_address="10.0.0.9:8500", ttl_s=6))
    assert isinstance(consul, ConsulDiscovery)
    assert (consul.address, consul.token, consul.ttl_s, consul.service) == ("http://10.0.0.9:8500", "t", 6, "tfscache")
    etcd = from_settings(_proposed("etcd", etcd_endpoints=["10.0.0.1:2379", "10.0.0.2:2379"], etcd_prefix="/x/"))
    assert isinstance(etcd, EtcdDiscovery)
    assert etcd.endpoints == ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    assert etcd.key_prefix == b"/x/tfscache/"
    with pytest.raises(ValueError, match="unknown discovery backend 'zk'"):
        from_settings(_proposed("zk"))


def test_advertise_peer() -> None:
    settings = _proposed("consul", advertise_host="10.1.2.3")
    assert advertise_peer(settings, 8500, 8501) == Peer("a", "10.1.2.3:8500", "10.1.2.3:8501")
    assert advertise_peer(settings, 8500, None) == Peer("a", "10.1.2.3:8500", "")
    settings.discovery.advertise_host = "fd00::1"
    assert advertise_peer(settings, 1, 2).grpc == "[fd00::1]:1"
    settings.discovery.advertise_host = ""
    settings.server.bind_address = "127.0.0.1"
    assert advertise_peer(settings, 1, 2).grpc == "127.0.0.1:1"
    settings.server.bind_address = "0.0.0.0"  # not reachable: fall back to this host's name
    assert not advertise_peer(settings, 1, 2).grpc.startswith("0.0.0.0")
