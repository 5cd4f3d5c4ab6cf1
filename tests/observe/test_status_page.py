"""The metrics port's status page and its JSON over HTTP (tfscache.observe.server), over a fake
cache: the page's files, ``/status/events?since=``, and the admin token asked as the admin API
asks for it (tfscache.auth; tests/admin/test_admin_api.py checks the gRPC side)."""

from __future__ import annotations

import asyncio
import urllib.error

import aiohttp
import pytest

from support.fakecache import FakeCache, resident
from tfscache.auth import INVALID, MISSING
from tfscache.cli import status
from tfscache.frontend.backends import NodeBackend
from tfscache.observe.metrics import Metrics
from tfscache.observe.server import PAGE, PAGE_FILES, ObserveServer

from .test_status_document import FakeUpstream, topology


@pytest.fixture
def cache() -> FakeCache:
    return FakeCache([resident("a", size=300), resident("b", state="loading")], max_models=2,
                     memory_bytes=1000)


async def serving(cache: FakeCache, token: str = "") -> tuple[ObserveServer, str]:
    metrics = Metrics(process=False)
    server = ObserveServer(metrics, topology([NodeBackend("node0", FakeUpstream("127.0.0.1:1"),
                                                          cache)]),
                           bind_address="127.0.0.1", port=0, token=token)
    port = await server.start()
    return server, f"http://127.0.0.1:{port}"


async def test_the_page_and_its_files_are_served_from_the_package(cache):
    server, url = await serving(cache)
    try:
        async with aiohttp.ClientSession() as session:
            for route, (name, content_type) in PAGE_FILES.items():
                async with session.get(url + route) as reply:
                    assert reply.status == 200 and reply.content_type == content_type
                    assert await reply.read() == (PAGE / name).read_bytes()
            async with session.get(url + "/") as reply:
                html = await reply.text()
        assert '<script src="page.js">' in html and 'href="page.css"' in html
        assert "http" not in html.replace("http-equiv", "")  # no CDN: nothing from elsewhere
    finally:
        await server.stop()


async def test_events_since_a_sequence_number_and_a_bad_one_is_400(cache):
    server, url = await serving(cache)
    events = server.metrics.cache_events("node0")
    try:
        async with aiohttp.ClientSession() as session:
            for name in ("a", "b", "c"):
                events.loaded((name, 1), 0.1, 10, True)
            events.evicted(("a", 1), "capacity", 10)
            async with session.get(url + "/status/events") as reply:
                doc = await reply.json()
            assert doc["seq"] == 4 and [e["kind"] for e in doc["events"]] == ["loaded"] * 3 + [
                "evicted"]
            async with session.get(url + "/status/events?since=2") as reply:
                assert [e["model"] for e in (await reply.json())["events"]] == ["c", "a"]
            for bad in ("-1", "x", "1.5", "²"):
                async with session.get(url + "/status/events", params={"since": bad}) as reply:
                    assert reply.status == 400
                    assert "since must be a sequence number" in (await reply.json())["error"]
    finally:
        await server.stop()


async def test_status_keeps_its_document_and_adds_the_gpu(cache):
    cache.gpu_reading = (512, 4096)
    server, url = await serving(cache)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/status") as reply:
                (node,) = (await reply.json())["nodes"]
        assert node["caps"] == {"max_models": 2, "memory_bytes": 1000}
        assert node["gpu"] == {"bytes": 512, "cap_bytes": 4096}
        assert [m["name"] for m in node["models"]] == ["a", "b"]
    finally:
        await server.stop()


async def test_with_a_token_the_json_asks_for_it_as_the_admin_api_does(cache):
    server, url = await serving(cache, token="s3cret")
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/status", "/status/events"):
                async with session.get(url + path) as reply:
                    assert reply.status == 401 and reply.headers["WWW-Authenticate"] == "Bearer"
                    assert (await reply.json()) == {"error": MISSING.format(carrier="header")}
                async with session.get(url + path,
                                       headers={"Authorization": "Bearer wrong"}) as reply:
                    assert reply.status == 401 and (await reply.json()) == {"error": INVALID}
                async with session.get(url + path,
                                       headers={"Authorization": "Bearer s3cret"}) as reply:
                    assert reply.status == 200
            for open_path in ("/", "/page.js", "/metrics"):  # no data in the page; scrapes stay open
                async with session.get(url + open_path) as reply:
                    assert reply.status == 200
    finally:
        await server.stop()


async def test_tfscache_status_sends_its_token(cache):
    server, url = await serving(cache, token="s3cret")
    address = url.removeprefix("http://")
    try:
        doc = await asyncio.to_thread(status.fetch, address, 10.0, token="s3cret")
        assert doc["nodes"][0]["name"] == "node0"
        with pytest.raises(urllib.error.HTTPError) as refused:
            await asyncio.to_thread(status.fetch, address, 10.0)
        assert refused.value.code == 401
        refused.value.close()
    finally:
        await server.stop()
