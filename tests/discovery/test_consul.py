"""The Consul backend against the FAKE agent: the exact calls, ACL tokens, an agent that lost its state."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from fakes.consul import FakeConsul
from support.waiting import until
from tfscache.discovery import DiscoveryError

from .conftest import WAIT_S, ConsulHarness, names, peer


@pytest.fixture
async def consul():
    fake = FakeConsul()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def harness(consul):
    h = ConsulHarness(consul)
    yield h
    await h.close()


async def test_registration_is_the_documented_service_definition(consul, harness) -> None:
    made = await harness.form(("a",))
    service = consul.services[f"{harness.service}-a"]
    assert service["Service"] == harness.service
    assert (service["Address"], service["Port"]) == ("127.0.0.1", int(peer("a").grpc.rsplit(":", 1)[1]))
    assert service["Meta"] == {"peer": "a", "grpc": peer("a").grpc, "rest": peer("a").rest}
    check = consul.checks[f"service:{harness.service}-a"]
    assert (check["TTL"], check["Status"], check["DeregisterCriticalServiceAfter"]) == (1.5, "passing", 600)
    # The TTL check is passed by its ID at TTL/3: wait for two passes.
    path = f"/v1/agent/check/pass/service:{harness.service}-a"
    await until(lambda: consul.requests.count(("PUT", path)) >= 2, WAIT_S, "two TTL passes")
    await made["a"].deregister()
    # nothing written after the deregistration (no TTL pass); the watch's blocking query may
    # still be answered and asked again, since the deregistration changed the index
    writes = [request for request in consul.requests if request[0] != "GET"]
    assert writes[-1] == ("PUT", f"/v1/agent/service/deregister/{harness.service}-a")
    assert not consul.services and not consul.checks
    queries = [p for m, p in consul.requests if m == "GET"]
    assert set(queries) == {f"/v1/health/service/{harness.service}"}


async def test_a_warning_check_leaves_the_passing_set(consul, harness) -> None:
    made = await harness.form(("a", "b"))
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{consul.url}/v1/agent/check/warn/service:{harness.service}-b") as resp:
            assert resp.status == 200
    await made["a"].wait_for(lambda m: names(m) == {"a"}, WAIT_S)
    await made["a"].wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)  # b's next pass restores it


async def test_acl_token_is_sent_and_checked() -> None:
    consul = FakeConsul(acl_token="s3cret")
    await consul.start()
    harness = ConsulHarness(consul)
    try:
        made = await harness.form(("a", "b"), token="s3cret")
        assert names(made["b"].members()) == {"a", "b"}

        wrong = harness.make(token="wrong", start_timeout_s=1.0)
        with pytest.raises(DiscoveryError, match="HTTP 403 'ACL not found'"):
            await wrong.register(peer("w"))
        with pytest.raises(DiscoveryError, match="no membership read"):
            await wrong.start()
        assert wrong.failing and wrong.members() == []

        anonymous = harness.make(start_timeout_s=1.0)
        with pytest.raises(DiscoveryError, match="HTTP 403 'Permission denied'"):
            await anonymous.register(peer("x"))
        # Reads are filtered, not refused: the backend must not take the empty answer for the truth.
        with pytest.raises(DiscoveryError, match="no membership read"):
            await anonymous.start()
        assert anonymous.failing and anonymous.members() == []
    finally:
        await harness.close()
        await consul.stop()


async def test_an_agent_restarted_without_state_gets_everyone_back(consul, harness) -> None:
    made = await harness.form(("a", "b", "c"))
    sizes: list[int] = []
    for discovery in made.values():
        discovery.subscribe(lambda m: sizes.append(len(m)))
    index_before = made["a"].index
    await consul.stop()
    await consul.start(reset=True)  # a dev-mode agent: empty catalog, index back at 1
    assert consul.index < index_before
    await until(lambda: len(consul.services) == 3, WAIT_S,
                "every sidecar registered again (404 on its TTL pass)")
    for discovery in made.values():
        await discovery.wait_for(lambda m: names(m) == {"a", "b", "c"}, WAIT_S)
    await until(lambda: all(d.index <= consul.index for d in made.values()), WAIT_S,
                "indexes reset")
    assert 0 not in sizes  # the empty catalog in between never reached a listener


async def test_index_going_backwards_resets_to_zero(consul, harness) -> None:
    (discovery,) = (await harness.form(("a",))).values()
    await until(lambda: discovery.index > 1, WAIT_S, "a blocking index")
    high = discovery.index
    await until(lambda: consul.queries[-1][1].get("index") == str(high), WAIT_S,
                "a blocking query in flight")
    discovery.index = high + 1000  # as if the agent had answered a higher index before losing state
    seen = len(consul.queries)
    other = harness.make()
    await other.register(peer("b"))  # wakes the blocking query with an index below high + 1000
    await discovery.wait_for(lambda m: names(m) == {"a", "b"}, WAIT_S)
    await until(lambda: len(consul.queries) > seen + 1, WAIT_S, "the next query")
    assert "index" not in consul.queries[seen][1]  # reset to 0: a non-blocking read, not a wait at high+1000
    assert consul.queries[seen + 1][1]["index"] == str(discovery.index)


async def test_register_gives_up_after_start_timeout_when_agent_is_down(consul, harness) -> None:
    await consul.stop()
    discovery = harness.make(start_timeout_s=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DiscoveryError, match="cannot register a"):
        await discovery.register(peer("a"))
    assert loop.time() - started < 3.0
    await consul.start()


async def test_the_requests_are_py_consuls_and_the_fake_reads_them() -> None:
    # What goes over the wire is py-consul's: lowercase field names, "passing=1", the token header.
    consul = FakeConsul(acl_token="s3cret")
    await consul.start()
    harness = ConsulHarness(consul)
    try:
        await harness.form(("a",), token="s3cret")
        await until(lambda: any(c["query"].get("index") for c in consul.calls), WAIT_S,
                    "a blocking query")
    finally:
        await harness.close()
        await consul.stop()
    assert {c["token"] for c in consul.calls} == {"s3cret"}
    (register,) = [c for c in consul.calls if c["path"] == "/v1/agent/service/register"]
    assert register["query"] == {"replace-existing-checks": "true"}
    service_id = f"{harness.service}-a"
    assert register["body"] == {
        "name": harness.service, "id": service_id, "address": "127.0.0.1",
        "port": int(peer("a").grpc.rsplit(":", 1)[1]), "tags": ["grpc", "rest"],
        "meta": {"peer": "a", "grpc": peer("a").grpc, "rest": peer("a").rest},
        "checks": [{"ttl": "1.5s", "CheckID": f"service:{service_id}", "Name": "tfscache sidecar a alive",
                    "Status": "passing", "DeregisterCriticalServiceAfter": "600s"}]}
    reads = [c["query"] for c in consul.calls if c["method"] == "GET"]
    assert reads[0] == {"passing": "1"}
    assert any(q == {"passing": "1", "index": q.get("index"), "wait": "5s"} and int(q["index"]) >= 1
               for q in reads[1:])


async def test_stop_does_not_wait_for_a_blocking_query(consul, harness) -> None:
    (discovery,) = (await harness.form(("a",), wait_s=300.0)).values()
    await until(lambda: consul.queries[-1][1].get("wait") == "300s", WAIT_S,
                "a 300 s blocking query in flight")
    # The query's thread cannot be interrupted; stop() abandons it instead of waiting 300 s.
    await asyncio.wait_for(discovery.stop(), 5.0)
    assert discovery.members() and consul.queries[-1][1].get("wait") == "300s"
