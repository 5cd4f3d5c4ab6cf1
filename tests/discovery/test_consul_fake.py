"""The FAKE Consul agent keeps Consul's documented behaviour for the endpoints it models.

These pin the fake itself, over plain HTTP, so the Consul backend's tests mean something.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from fakes.consul import FakeConsul, parse_duration
from support.waiting import until

from .conftest import WAIT_S


@pytest.fixture
async def consul():
    fake = FakeConsul(deregister_minimum_s=0.3, reap_interval_s=0.05)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


def service(name="web", sid="web-1", ttl="1s", status=None, **check):
    body = {"ID": sid, "Name": name, "Address": "10.0.0.1", "Port": 8500, "Meta": {"rest": "10.0.0.1:8501"},
            "Check": {"TTL": ttl, **({"Status": status} if status else {}), **check}}
    return body


async def put(http, consul, path, body=None, **params):
    async with http.put(consul.url + path, json=body, params=params) as resp:
        return resp.status, await resp.text()


async def health(http, consul, name="web", **params):
    async with http.get(f"{consul.url}/v1/health/service/{name}", params=params) as resp:
        return resp.status, resp.headers, await resp.json() if resp.status == 200 else await resp.text()


def test_parse_duration() -> None:
    assert parse_duration("10s") == 10 and parse_duration("1.5s") == 1.5 and parse_duration("1m30s") == 90
    assert parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        parse_duration("10")


async def test_register_defaults_and_health_entry(http, consul) -> None:
    assert await put(http, consul, "/v1/agent/service/register", service(status="passing")) == (200, "")
    status, headers, entries = await health(http, consul)
    assert status == 200 and int(headers["X-Consul-Index"]) > 1 and headers["X-Consul-KnownLeader"] == "true"
    (entry,) = entries
    assert entry["Service"]["ID"] == "web-1" and entry["Service"]["Meta"] == {"rest": "10.0.0.1:8501"}
    assert entry["Node"]["Node"] == "fake-node"
    assert [c["CheckID"] for c in entry["Checks"]] == ["serfHealth", "service:web-1"]
    assert entry["Checks"][1]["Name"] == "Service 'web' check"


async def test_new_ttl_check_starts_critical_and_passing_filters(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service())
    assert len((await health(http, consul))[2]) == 1
    assert (await health(http, consul, passing="true"))[2] == []
    assert (await health(http, consul, passing=""))[2] == []  # ?passing alone means true
    await put(http, consul, "/v1/agent/check/pass/service:web-1", note="ok")
    (entry,) = (await health(http, consul, passing="true"))[2]
    assert entry["Checks"][1]["Output"] == "ok"
    await put(http, consul, "/v1/agent/check/warn/service:web-1")
    assert (await health(http, consul, passing="true"))[2] == []  # warning is not passing


async def test_ttl_expiry_turns_the_check_critical(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service(ttl="300ms", status="passing"))
    started = time.monotonic()
    await until(lambda: consul.checks["service:web-1"]["Status"] == "critical", timeout=5, what="TTL expiry")
    assert time.monotonic() - started >= 0.25
    (entry,) = (await health(http, consul))[2]
    assert (entry["Checks"][1]["Status"], entry["Checks"][1]["Output"]) == ("critical", "TTL expired")


async def test_deregister_critical_service_after(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register",
              service(ttl="100ms", status="passing", DeregisterCriticalServiceAfter="200ms"))
    await until(lambda: "web-1" not in consul.services, timeout=5, what="the reaper")
    assert "service:web-1" not in consul.checks


async def test_deregister_and_unknown_ids(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service())
    assert await put(http, consul, "/v1/agent/service/deregister/web-1") == (200, "")
    assert (await health(http, consul))[2] == []
    assert await put(http, consul, "/v1/agent/service/deregister/web-1") == (
        404, 'Unknown service ID "web-1". Ensure that the service ID is passed, not the service name.')
    assert await put(http, consul, "/v1/agent/check/pass/service:web-1") == (
        404, 'Unknown check ID "service:web-1". Ensure that the check ID is passed, not the check name.')
    assert await put(http, consul, "/v1/agent/service/register", {"ID": "x"}) == (400, "Missing service name")
    async with http.get(consul.url + "/v1/agent/check/pass/x") as resp:
        assert resp.status == 405


async def test_blocking_query_returns_early_on_change(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service(status="passing"))
    _, headers, _ = await health(http, consul)
    index = headers["X-Consul-Index"]
    query = asyncio.create_task(health(http, consul, index=index, wait="30s"))
    await until(lambda: len(consul.queries) == 2, WAIT_S, "the blocking query to arrive")
    assert not query.done()
    await put(http, consul, "/v1/agent/service/register", service(sid="web-2", status="passing"))
    _, headers, entries = await asyncio.wait_for(query, 5)
    assert int(headers["X-Consul-Index"]) > int(index) and len(entries) == 2


async def test_a_pass_that_changes_nothing_does_not_wake_a_blocking_query(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service(status="passing"))
    _, headers, _ = await health(http, consul)
    started = time.monotonic()
    query = asyncio.create_task(health(http, consul, index=headers["X-Consul-Index"], wait="400ms"))
    await until(lambda: len(consul.queries) == 2, WAIT_S, "the blocking query to arrive")
    await put(http, consul, "/v1/agent/check/pass/service:web-1")
    _, after, _ = await asyncio.wait_for(query, 5)
    assert after["X-Consul-Index"] == headers["X-Consul-Index"]
    assert time.monotonic() - started >= 0.4  # waited out `wait`, then answered with the same index


async def test_bad_index_and_wait(http, consul) -> None:
    assert (await health(http, consul, index="x"))[0:1] == (400,)
    assert (await health(http, consul, index="1", wait="forever"))[0:1] == (400,)


async def test_acl_answers() -> None:
    consul = FakeConsul(acl_token="s3cret")
    await consul.start()
    try:
        async with aiohttp.ClientSession() as http:
            assert await put(http, consul, "/v1/agent/service/register", service()) == (403, "Permission denied")
            async with http.put(consul.url + "/v1/agent/service/register", json=service(status="passing"),
                                headers={"X-Consul-Token": "nope"}) as resp:
                assert (resp.status, await resp.text()) == (403, "ACL not found")
            async with http.put(consul.url + "/v1/agent/service/register", json=service(status="passing"),
                                headers={"Authorization": "Bearer s3cret"}) as resp:
                assert resp.status == 200
            status, headers, entries = await health(http, consul)
            assert (status, entries, headers["X-Consul-Results-Filtered-By-ACLs"]) == (200, [], "true")
            status, headers, entries = await health(http, consul, token="s3cret")
            assert len(entries) == 1 and "X-Consul-Results-Filtered-By-ACLs" not in headers
    finally:
        await consul.stop()


async def test_outage_drops_blocking_queries_and_restart_keeps_state(http, consul) -> None:
    await put(http, consul, "/v1/agent/service/register", service(status="passing"))
    _, headers, _ = await health(http, consul)
    query = asyncio.create_task(health(http, consul, index=headers["X-Consul-Index"], wait="30s"))
    await until(lambda: len(consul.queries) == 2, WAIT_S, "the blocking query to arrive")
    port = consul.port
    await consul.stop()
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(query, 5)
    with pytest.raises(aiohttp.ClientError):
        await health(http, consul)
    assert await consul.start() == port
    _, after, entries = await health(http, consul)
    assert after["X-Consul-Index"] == headers["X-Consul-Index"] and len(entries) == 1
    await consul.stop()
    await consul.start(reset=True)
    _, after, entries = await health(http, consul)
    assert entries == [] and int(after["X-Consul-Index"]) < int(headers["X-Consul-Index"])
