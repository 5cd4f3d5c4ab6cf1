"""DNS discovery against a real DNS server (dnsmasq, tests/support/dnsmasq.py) with records the test writes.

SRV records are what a headless Kubernetes Service publishes for a StatefulSet's named ports
(``_grpc._tcp.SERVICE`` -> ``POD.SERVICE``); A/AAAA records are its plain form (SERVICE -> pod IPs).
Membership changes when the test rewrites the records: A/AAAA with SIGHUP (dnsmasq re-reads its
addn-hosts file), SRV with a restart on the same port (dnsmasq reads those only at start).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from support.dnsmasq import Dnsmasq
from support.waiting import until
from tfscache import settings as settings_mod
from tfscache.discovery import DiscoveryError, Peer, from_settings, make_discovery
from tfscache.discovery.dns import DnsDiscovery
from tfscache.discovery.static import StaticDiscovery

from .conftest import WAIT_S, names

SERVICE = "pods.tfs.test"
FAST = {"retry_initial_s": 0.05, "retry_max_s": 0.3, "start_timeout_s": 5.0, "request_timeout_s": 0.5}


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory: pytest.TempPathFactory):
    with Dnsmasq(tmp_path_factory.mktemp("dnsmasq")) as server:
        yield server


@pytest.fixture
def dns(dnsmasq: Dnsmasq):
    """The module's dnsmasq with no records, running (a test may have killed it)."""
    dnsmasq.reset()
    return dnsmasq


@pytest.fixture
async def made():
    """DnsDiscovery objects made by a test, stopped at teardown."""
    objects: list[DnsDiscovery] = []
    yield objects
    for discovery in objects:
        await discovery.stop()


def make(made: list, dns: Dnsmasq, **options) -> DnsDiscovery:
    discovery = make_discovery("dns", **{"dns_name": SERVICE, "server": dns.server, "interval_s": 0.1,
                                         **FAST, **options})
    made.append(discovery)
    return discovery


def pods(dns: Dnsmasq, ports: dict[str, tuple[int, int | None]]) -> None:
    """A StatefulSet's pods behind the headless Service: POD.SERVICE -> 127.0.0.1, SRV per named port."""
    dns.set_hosts({f"{pod}.{SERVICE}": ["127.0.0.1"] for pod in ports})
    dns.set_srv([(f"_grpc._tcp.{SERVICE}", f"{pod}.{SERVICE}", grpc) for pod, (grpc, _) in ports.items()]
                + [(f"_rest._tcp.{SERVICE}", f"{pod}.{SERVICE}", rest) for pod, (_, rest) in ports.items() if rest])


async def test_srv_records_name_peers_by_pod_and_carry_both_ports(dns, made) -> None:
    pods(dns, {"tfscache-0": (8500, 8501), "tfscache-1": (9500, 9501), "tfscache-2": (7500, None)})
    seen: list[list[Peer]] = []
    discovery = make(made, dns)
    discovery.subscribe(seen.append)
    await discovery.start()
    assert discovery.members() == [Peer("tfscache-0", "127.0.0.1:8500", "127.0.0.1:8501"),
                                   Peer("tfscache-1", "127.0.0.1:9500", "127.0.0.1:9501"),
                                   Peer("tfscache-2", "127.0.0.1:7500", "")]
    assert seen == [discovery.members()]
    pods(dns, {"tfscache-0": (8500, 8501), "tfscache-1": (9500, 9501)})  # tfscache-2 is gone
    await discovery.wait_for(lambda m: names(m) == {"tfscache-0", "tfscache-1"}, WAIT_S)
    await until(lambda: names(seen[-1]) == {"tfscache-0", "tfscache-1"}, WAIT_S, "the listener")
    assert not discovery.failing


async def test_srv_target_without_an_address_is_left_out(dns, made) -> None:
    pods(dns, {"tfscache-0": (8500, 8501)})
    dns.set_srv(dns.srv_records + [(f"_grpc._tcp.{SERVICE}", f"ghost.{SERVICE}", 8500)])  # no A record for it
    discovery = make(made, dns)
    await discovery.start()
    assert names(discovery.members()) == {"tfscache-0"}


async def test_address_records_name_peers_by_ip_and_follow_sighup(dns, made) -> None:
    dns.set_hosts({SERVICE: ["127.0.0.3", "127.0.0.2"]})
    discovery = make(made, dns, record="a", grpc_port=8500, rest_port=8501)
    await discovery.start()
    assert discovery.members() == [Peer("127.0.0.2", "127.0.0.2:8500", "127.0.0.2:8501"),
                                   Peer("127.0.0.3", "127.0.0.3:8500", "127.0.0.3:8501")]
    dns.set_hosts({SERVICE: ["127.0.0.2", "127.0.0.3", "127.0.0.4"]})  # SIGHUP: a new pod
    await discovery.wait_for(lambda m: len(m) == 3, WAIT_S)
    dns.set_hosts({SERVICE: ["127.0.0.4"]})
    await discovery.wait_for(lambda m: names(m) == {"127.0.0.4"}, WAIT_S)


async def test_ipv6_only_records_and_no_rest_port(dns, made) -> None:
    dns.set_hosts({SERVICE: ["fd00::2"]})
    discovery = make(made, dns, record="a", grpc_port=8500, rest_port=0)
    await discovery.start()
    assert discovery.members() == [Peer("fd00::2", "[fd00::2]:8500", "")]


async def test_reload_resolves_at_once(dns, made) -> None:
    dns.set_hosts({SERVICE: ["127.0.0.2"]})
    discovery = make(made, dns, record="a", interval_s=3600)  # no re-read on its own within the test
    await discovery.start()
    dns.set_hosts({SERVICE: ["127.0.0.2", "127.0.0.3"]})
    assert await discovery.reload()
    await discovery.wait_for(lambda m: len(m) == 2, WAIT_S)


async def test_no_records_at_start_is_an_empty_membership_and_empty_reads_never_shrink_it(dns, made) -> None:
    discovery = make(made, dns)
    await discovery.start()  # NXDOMAIN: nobody ready yet (a new cluster), not a failure
    assert discovery.members() == [] and not discovery.failing
    pods(dns, {"tfscache-0": (8500, 8501)})
    await discovery.wait_for(lambda m: names(m) == {"tfscache-0"}, WAIT_S)
    pods(dns, {})  # every pod unready at once: the ring stays as it was
    await until(lambda: discovery.activities()["dns discovery: membership read (empty result ignored)"][1] >= 2,
                WAIT_S, "two empty reads")
    assert names(discovery.members()) == {"tfscache-0"}


async def test_outage_keeps_the_membership_and_logs_once(dns, made, caplog: pytest.LogCaptureFixture) -> None:
    pods(dns, {"tfscache-0": (8500, 8501), "tfscache-1": (9500, 9501)})
    discovery = make(made, dns)
    await discovery.start()
    await discovery.register(Peer("tfscache-0", "127.0.0.1:8500"))
    changes: list[set[str]] = []
    discovery.subscribe(lambda m: changes.append(names(m)))
    caplog.set_level(logging.INFO, logger="tfscache.discovery")
    caplog.clear()
    dns.kill()
    await until(lambda: discovery.failing and discovery.activities()[
        f"dns discovery (tfscache-0): resolving {SERVICE} (SRV)"][1] >= 3, WAIT_S,
                "three failed reads")
    assert names(discovery.members()) == {"tfscache-0", "tfscache-1"} and changes == []
    failing = [r.getMessage() for r in caplog.records if " failing:" in r.getMessage()]
    assert len(failing) == 1 and "Timeout" in failing[0] and "keeping the last known membership" in failing[0]
    dns.start()
    await until(lambda: not discovery.failing, WAIT_S, "recovery")
    assert sum(" recovered after " in r.getMessage() for r in caplog.records) == 1
    pods(dns, {"tfscache-0": (8500, 8501)})  # changes are seen again
    await discovery.wait_for(lambda m: names(m) == {"tfscache-0"}, WAIT_S)


async def test_start_fails_clearly_when_no_server_answers(dns, made) -> None:
    dns.kill()
    discovery = make(made, dns, start_timeout_s=0.5, request_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="dns discovery: no membership read within 0.5 s"):
        await discovery.start()
    assert time.monotonic() - started < 5


async def test_a_name_in_another_domain_is_a_failure_not_an_empty_membership(dns, made) -> None:
    # dnsmasq answers REFUSED outside tfs.test (no upstream): a broken resolver, not "no pods".
    discovery = make(made, dns, dns_name="pods.elsewhere.example", start_timeout_s=0.5)
    with pytest.raises(DiscoveryError):
        await discovery.start()
    assert discovery.failing


async def test_register_and_deregister_change_nothing(dns, made) -> None:
    pods(dns, {"tfscache-0": (8500, 8501)})
    discovery = make(made, dns)
    await discovery.start()
    await discovery.register(Peer("tfscache-9", "127.0.0.1:1"))  # not in DNS: logged, not added
    await discovery.deregister()
    assert names(discovery.members()) == {"tfscache-0"}
    assert "nothing to register" in discovery.registration_note  # what `tfscache join` answers
    assert "nothing to register" in StaticDiscovery.registration_note


def test_settings_build_a_dns_discovery(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    base = {"model_repository": str(tmp_path / "m"), "node.node_address": "h:1", "ring.self_name": "tfscache-0"}
    s = settings_mod.load(env={"TFSCACHE_DISCOVERY_BACKEND": "dns", "TFSCACHE_DISCOVERY_DNS_NAME": SERVICE,
                               "TFSCACHE_DISCOVERY_DNS_SERVER": "127.0.0.1:5353",
                               "TFSCACHE_DISCOVERY_DNS_RECORD": "a", "TFSCACHE_DISCOVERY_DNS_INTERVAL_S": "2"},
                          overrides=base)
    discovery = from_settings(s)
    assert isinstance(discovery, DnsDiscovery)
    assert (discovery.dns_name, discovery.record, discovery.server, discovery.interval_s) == \
        (SERVICE, "a", ("127.0.0.1", 5353), 2.0)


@pytest.mark.parametrize("env, message", [
    ({}, "bad value for setting discovery.dns_name: '' (required with discovery.backend = dns)"),
    ({"TFSCACHE_DISCOVERY_DNS_NAME": SERVICE, "TFSCACHE_DISCOVERY_DNS_RECORD": "txt"},
     "discovery.dns_record: 'txt' (must be srv or a)"),
    ({"TFSCACHE_DISCOVERY_DNS_NAME": SERVICE, "TFSCACHE_DISCOVERY_DNS_SERVER": "dns.local:53"},
     "discovery.dns_server: 'dns.local:53' (must be IP[:PORT] or [IPv6]:PORT of a DNS server"),
    ({"TFSCACHE_DISCOVERY_DNS_NAME": SERVICE, "TFSCACHE_DISCOVERY_DNS_SERVER": "127.0.0.1:0"},
     "discovery.dns_server: '127.0.0.1:0'"),
])
def test_bad_dns_settings_fail_at_load_naming_the_field(tmp_path: Path, env: dict, message: str) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(settings_mod.SettingsError) as info:
        settings_mod.load(env={"TFSCACHE_DISCOVERY_BACKEND": "dns", **env},
                          overrides={"model_repository": str(tmp_path / "m"), "node.node_address": "h:1",
                                     "ring.self_name": "tfscache-0"})
    assert message in str(info.value)
