"""The etcd backend against real etcd: the stored keys, a 3-member cluster losing members, fail-over."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import aiohttp
import pytest

from support.etcd import EtcdCluster
from support.waiting import until
from tfscache.tasks import cancel
from tfscache.discovery.etcd import EtcdDiscovery, prefix_end

from .conftest import FAST_RETRY, WAIT_S, EtcdHarness, names, peer


async def _range(endpoint: str, prefix: bytes) -> list[dict]:
    body = {"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(prefix_end(prefix)).decode()}
    async with aiohttp.ClientSession() as http:
        async with http.post(endpoint + "/v3/kv/range", json=body) as resp:
            return (await resp.json()).get("kvs", [])


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


async def test_each_sidecar_owns_a_leased_key(etcd: EtcdCluster) -> None:
    harness = EtcdHarness(etcd)
    try:
        made = await harness.form(("a", "b"))
        kvs = await _range(etcd.endpoints[0], f"{harness.prefix}/tfscache/".encode())
        stored = {base64.b64decode(kv["key"]).decode(): (json.loads(base64.b64decode(kv["value"])), kv["lease"])
                  for kv in kvs}
        assert set(stored) == {f"{harness.prefix}/tfscache/a", f"{harness.prefix}/tfscache/b"}
        value, lease = stored[f"{harness.prefix}/tfscache/a"]
        assert value == {"name": "a", "grpc": peer("a").grpc, "rest": peer("a").rest}
        assert lease == made["a"]._lease and lease != "0"
        await made["a"].deregister()  # revokes the lease: the key goes with it
        assert len(await _range(etcd.endpoints[0], f"{harness.prefix}/tfscache/".encode())) == 1
    finally:
        await harness.close()


async def test_one_member_of_three_killed_costs_nothing(etcd3: EtcdCluster, caplog) -> None:
    harness = EtcdHarness(etcd3)  # sidecar i starts at member i
    try:
        made = await harness.form(("a", "b", "c"))
        changes: list[set[str]] = []
        for discovery in made.values():
            discovery.subscribe(lambda m: changes.append(names(m)))
        assert made["a"].endpoints[0] == etcd3.endpoints[0]
        caplog.set_level(logging.INFO, logger="tfscache.discovery")
        etcd3.kill(0)  # a's member (and maybe the leader)
        # a's watch breaks and moves on; nobody's membership changes, for longer than a TTL.
        await until(lambda: made["a"]._current != 0, WAIT_S, "a to fail over to another member")
        await until(lambda: not made["a"].failing, WAIT_S, "a's watch to recover on another member")
        for discovery in made.values():
            assert names(discovery.members()) == {"a", "b", "c"}
        # Leases outlive the election: after two TTLs every sidecar is still there, and changes flow.
        d = harness.make()
        await d.start()
        await d.register(peer("d"))
        for discovery in made.values():
            await discovery.wait_for(lambda m: names(m) == {"a", "b", "c", "d"}, WAIT_S)
        await made["b"].deregister()
        for discovery in (made["a"], made["c"], d):
            await discovery.wait_for(lambda m: names(m) == {"a", "c", "d"}, WAIT_S)
        assert all({"a", "c"} <= change for change in changes)  # nobody else ever left
        await asyncio.to_thread(etcd3.restart, 0)
    finally:
        await harness.close()


async def test_whole_cluster_down_then_back(etcd3: EtcdCluster) -> None:
    harness = EtcdHarness(etcd3)
    try:
        made = await harness.form(("a", "b", "c"))
        changes: list[set[str]] = []
        for discovery in made.values():
            discovery.subscribe(lambda m: changes.append(names(m)))
        await harness.outage()
        for discovery in made.values():
            await until(lambda: all(f for w, (f, _) in discovery.activities().items() if "empty" not in w),
                        WAIT_S, "watch and keep-alive failing")
            assert names(discovery.members()) == {"a", "b", "c"}
        await harness.recover()
        for discovery in made.values():
            await until(lambda: not discovery.failing, WAIT_S, "recovery")
        assert changes == []
        await made["c"].deregister()
        for name in "ab":
            await made[name].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)
    finally:
        await harness.close()


async def test_expired_lease_is_replaced(etcd: EtcdCluster) -> None:
    harness = EtcdHarness(etcd)
    try:
        made = await harness.form(("a", "b"))
        old = made["a"]._lease
        async with aiohttp.ClientSession() as http:  # as if it expired during a long outage
            async with http.post(etcd.endpoints[0] + "/v3/lease/revoke", json={"ID": old}) as resp:
                assert resp.status == 200
        await made["b"].wait_for(lambda m: names(m) == {"b"}, WAIT_S)
        await made["b"].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)  # a's keep-alive re-registered
        assert made["a"]._lease not in (None, old)
    finally:
        await harness.close()


async def test_a_put_that_failed_is_retried_under_a_new_lease(etcd: EtcdCluster) -> None:
    # Found by the namespace cluster on a loaded machine: a grant answered, the put after it timed
    # out, and the lease expired before the next try; every later put was "requested lease not
    # found", the sidecar believed itself registered and stayed off every other ring.
    harness = EtcdHarness(etcd)
    try:
        made = await harness.form(("a", "b"))
        a = made["a"]
        await cancel(a._keepalive_task)  # hold the keep-alive still while the lease goes
        old = a._lease
        async with aiohttp.ClientSession() as http:
            async with http.post(etcd.endpoints[0] + "/v3/lease/revoke", json={"ID": old}) as resp:
                assert resp.status == 200
        a._written = False  # as after a put that timed out: the next try writes the key again
        a._keepalive_task = asyncio.create_task(a._keepalive())
        key = f"{harness.prefix}/tfscache/a".encode()

        async def a_key_lease() -> str | None:  # b's view may still be the one from before the revoke
            kvs = await _range(etcd.endpoints[0], key)
            return kvs[0]["lease"] if kvs and kvs[0]["lease"] != old else None

        lease = await until(a_key_lease, WAIT_S, "a's key written again under a new lease")
        assert lease == a._lease
        await made["b"].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)
    finally:
        await harness.close()


async def test_endpoints_fail_over_in_order(etcd: EtcdCluster) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    discovery = EtcdDiscovery(endpoints=[dead, etcd.endpoints[0]], prefix="/failover", **FAST_RETRY)
    try:
        await discovery.start()
        await discovery.register(peer("a"))
        await discovery.wait_for(lambda m: names(m) == {"a"}, WAIT_S)
        assert discovery._current == 1
    finally:
        await discovery.deregister()
        await discovery.stop()


@pytest.mark.parametrize("endpoints", ["", []])
def test_needs_an_endpoint(endpoints) -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        EtcdDiscovery(endpoints=endpoints)
