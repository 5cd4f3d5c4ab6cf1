"""Membership over every backend: forming, leaving, TTL expiry, outages, listeners."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import pytest

from support.waiting import until
from tfscache.discovery import Discovery, DiscoveryError, make_discovery

from .conftest import WAIT_S, Harness, names, peer


async def test_three_sidecars_see_each_other(harness: Harness) -> None:
    seen: list[list] = []
    first = harness.make()
    first.subscribe(seen.append)
    made = await harness.form(("a", "b", "c"))
    await first.start()
    await first.register(peer("a2") if harness.name != "static" else peer("a"))
    expected = {"a", "b", "c"} | ({"a2"} if harness.name != "static" else set())
    for discovery in [first, *made.values()]:
        members = await discovery.wait_for(lambda m: names(m) == expected, WAIT_S)
        assert members == sorted(map(peer, expected), key=lambda p: p.name)  # addresses round-trip
    await until(lambda: seen and names(seen[-1]) == expected, WAIT_S,
                "the listener to see the last change")
    assert seen[-1] == first.members()
    assert not any(d.failing for d in made.values())


async def test_listener_may_be_async_and_unsubscribed(harness: Harness) -> None:
    calls: list[set[str]] = []

    async def listener(members) -> None:
        await asyncio.sleep(0)
        calls.append(names(members))

    watcher = harness.make()
    unsubscribe = watcher.subscribe(listener)
    await harness.form(("a", "b", "c"))
    await watcher.start()
    await until(lambda: calls and calls[-1] == {"a", "b", "c"}, WAIT_S, "the async listener")
    unsubscribe()
    count = len(calls)
    if harness.name == "static":
        harness.write(["a", "b"])
        assert await watcher.reload()
    else:
        extra = harness.make()
        await extra.start()
        await extra.register(peer("d"))
    await watcher.wait_for(lambda m: len(m) != 3, WAIT_S)
    assert len(calls) == count


async def test_deregister_is_seen_before_any_ttl(dynamic_harness: Harness) -> None:
    # A TTL of 60 s: the others can only see c leave because it deregistered.
    made = await dynamic_harness.form(("a", "b", "c"), ttl_s=60)
    await made["c"].deregister()
    for name in "ab":
        await made[name].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)
    await made["c"].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)  # c still watches
    await made["c"].register(peer("c"))
    await made["a"].wait_for(lambda m: names(m) == {"a", "b", "c"}, WAIT_S)


async def test_member_without_keepalive_leaves_after_its_ttl(dynamic_harness: Harness) -> None:
    made = await dynamic_harness.form(("a", "b", "c"))
    stopped = time.monotonic()
    await made["c"].stop()  # keep-alive gone, no deregistration: as if the sidecar was killed
    for name in "ab":
        await made[name].wait_for(lambda m: names(m) == {"a", "b"}, dynamic_harness.ttl_s + WAIT_S)
    # The last keep-alive was at most TTL/3 before the stop, so the entry lived at least 2/3 TTL more.
    assert time.monotonic() - stopped >= dynamic_harness.ttl_s * 0.6


async def test_outage_keeps_the_last_membership_and_logs_once(dynamic_harness: Harness,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    made = await dynamic_harness.form(("a", "b", "c"))
    changes: list[set[str]] = []
    for discovery in made.values():
        discovery.subscribe(lambda m: changes.append(names(m)))
    caplog.set_level(logging.INFO, logger="tfscache.discovery")
    caplog.clear()

    await dynamic_harness.outage()
    # Every activity of every sidecar fails, then fails again several times (past the TTL).
    for discovery in made.values():
        await until(lambda: all(failing and attempts >= 3
                                for what, (failing, attempts) in discovery.activities().items()
                                if "empty result" not in what),
                    timeout=WAIT_S, what="every activity failing repeatedly")
    outage_started = time.monotonic()
    await until(lambda: time.monotonic() - outage_started > dynamic_harness.ttl_s, timeout=WAIT_S,
                what="an outage longer than the TTL")
    for discovery in made.values():
        assert names(discovery.members()) == {"a", "b", "c"}
    assert changes == []
    messages = [r.getMessage() for r in caplog.records]
    failing_lines = Counter(m.split(" failing:")[0] for m in messages if " failing:" in m)
    assert len(failing_lines) == 6 and set(failing_lines.values()) == {1}, failing_lines

    await dynamic_harness.recover()
    for discovery in made.values():
        await until(lambda: not discovery.failing, WAIT_S, "recovery")
    messages = [r.getMessage() for r in caplog.records]
    recovered = Counter(m.split(" recovered")[0] for m in messages if " recovered" in m)
    assert recovered == failing_lines
    # Changes are seen again.
    await made["c"].deregister()
    for name in "ab":
        await made[name].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)
    assert all(change for change in changes)  # never an empty membership


async def test_start_fails_clearly_when_the_backend_is_down(dynamic_harness: Harness) -> None:
    await dynamic_harness.outage()
    discovery = dynamic_harness.make(start_timeout_s=0.5)
    try:
        with pytest.raises(DiscoveryError, match="no membership read within 0.5 s"):
            await discovery.start()
        with pytest.raises(DiscoveryError, match="cannot register a"):
            await discovery.register(peer("a"))
    finally:
        await dynamic_harness.recover()


def test_backends_are_picked_by_name(tmp_path) -> None:
    assert type(make_discovery("static", peers=[peer("a")])).__name__ == "StaticDiscovery"
    assert type(make_discovery("consul", address="127.0.0.1:1")).__name__ == "ConsulDiscovery"
    assert type(make_discovery("etcd", endpoints="127.0.0.1:1,127.0.0.1:2")).__name__ == "EtcdDiscovery"
    assert type(make_discovery("dns", dns_name="tfscache-headless")).__name__ == "DnsDiscovery"
    with pytest.raises(ValueError, match="unknown discovery backend 'zk'; known: consul, dns, etcd, static"):
        make_discovery("zk")



class _Applied(Discovery):
    """A backend whose reads the test hands in (``_apply``), to pin the hold on removals."""

    name = "test"

    async def start(self) -> None: ...

    async def register(self, peer) -> None: ...

    async def deregister(self) -> None: ...

    async def stop(self) -> None:
        await self._stop_release()


async def test_removals_after_this_sidecars_registration_lapsed_are_held_for_a_ttl() -> None:
    # After an outage of the registry itself, the others' registrations lapsed too and the
    # deletions arrive in a burst: they must not move the ring while everyone re-registers.
    discovery = _Applied()
    seen: list[set[str]] = []
    discovery.subscribe(lambda m: seen.append(names(m)))
    await discovery._apply([peer("a"), peer("b"), peer("c")])
    discovery._hold_removals(2.0)  # its own keep-alive failed (or found its lease expired)
    await discovery._apply([peer("a"), peer("c")])  # b's lease expired in the outage
    await discovery._apply([peer("c")])
    await discovery._apply([peer("a"), peer("c"), peer("d")])  # an addition is applied at once
    await discovery._apply([peer("a"), peer("b"), peer("c"), peer("d")])  # b registered again
    assert seen == [{"a", "b", "c"}, {"a", "b", "c", "d"}]
    # A member that really went stays until the hold ends; then the latest read applies as it came.
    await discovery._apply([peer("a"), peer("c"), peer("d")])
    assert names(discovery.members()) == {"a", "b", "c", "d"}
    await until(lambda: seen[-1] == {"a", "c", "d"}, WAIT_S, "the hold to end")
    assert names(discovery.members()) == {"a", "c", "d"}
    # Without a hold, removals apply at once.
    await discovery._apply([peer("a"), peer("c")])
    assert names(discovery.members()) == {"a", "c"}
    await discovery.stop()
