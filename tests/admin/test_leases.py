"""Leases against evict and drain, in-process: a ServeApp with one real ``tfscache node`` child.

A lease is what a request in flight holds; holding one here (``cache.acquire``) makes
"a request is in flight" deterministic without a slow model.
"""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
from grpc_health.v1 import health_pb2
import pytest
import pytest_asyncio

from support.node import node_template
from support.waiting import until
from tfscache import errors
from tfscache import settings as settings_mod
from tfscache.app import ServeApp
from tfscache.wire import admin_pb2

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's apps live on one loop


def settings_for(admin_repo, state_dir, **more):
    return settings_mod.load(env={}, overrides={
        "model_repository": str(admin_repo), "node.local_nodes": 1, "server.bind_address": "127.0.0.1",
        "server.grpc_port": 0, "server.rest_port": 0, "server.grace_s": 1, "server.admin_port": 0,
        "node.state_dir": str(state_dir), "node.template_socket": node_template(), **more})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def apps(admin_repo, tmp_path_factory):
    """An app (one node) for each test below, started at once (their nodes' starts overlap):
    "evict", "drain" and "two nodes" (replicas on both). Each test ends or empties its own."""
    directory = tmp_path_factory.mktemp("leases")
    made = {"evict": ServeApp(settings_for(admin_repo, directory / "evict")),
            "drain": ServeApp(settings_for(admin_repo, directory / "drain")),
            "two nodes": ServeApp(settings_for(admin_repo, directory / "two", **{
                "node.local_nodes": 2, "ring.replicas_per_model": 2}))}
    started = await asyncio.gather(*(app.start() for app in made.values()), return_exceptions=True)
    try:
        for result in started:  # health and the admin server: app.lifecycle
            if isinstance(result, BaseException):
                raise result
        yield made
    finally:
        for app, result in zip(made.values(), started):
            if not isinstance(result, BaseException):
                await app.lifecycle.shutdown(grace=0)


def rpc(channel, method: str, response_type, streaming: bool = False):
    make = channel.unary_stream if streaming else channel.unary_unary
    return make(f"/tfscache.admin.Admin/{method}", request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_type.FromString)


async def test_evicting_a_leased_model_names_its_leases(apps):
    app = apps["evict"]
    cache = app.backends["node0"].cache
    leases = [await cache.acquire("addk_1"), await cache.acquire("addk_1")]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.lifecycle.admin_port}") as channel:
        evict = rpc(channel, "Evict", admin_pb2.ModelResponse)
        for held in (2, 1):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await evict(admin_pb2.ModelRequest(name="addk_1"))
            assert (info.value.code(), info.value.details()) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not evicted: model addk_1 version 1 is held by {held} lease{'s' if held > 1 else ''} "
                "(requests in flight) on node node0")
            leases.pop().release()
        response = await evict(admin_pb2.ModelRequest(name="addk_1", version=1, node="node0"))
        assert [(r.node, [m.name for m in r.models]) for r in response.results] == [("node0", ["addk_1"])]
    assert cache.snapshot() == []


async def test_a_process_drain_waits_for_requests_in_flight_then_unloads(apps):
    app = apps["drain"]
    cache = app.backends["node0"].cache
    await cache.preload("addk_2")
    lease = await cache.acquire("addk_1")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.lifecycle.admin_port}") as channel:
        stream = rpc(channel, "Drain", admin_pb2.DrainProgress, streaming=True)(admin_pb2.DrainRequest())
        seen = []
        async for progress in stream:  # until only the leased model is left
            seen.append(progress)
            if progress.models_left == 1 and progress.phase == "unloading":
                break
        assert (seen[-1].leases, seen[-1].done, seen[0].models_total) == (1, False, 2)
        assert app.lifecycle.health.status("") == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(errors.NodeUnavailable, match="is draining"):
            await cache.acquire("addk_1")  # even a hit: new requests go elsewhere
        with pytest.raises(TimeoutError):  # the drain is not finished while the request runs
            await asyncio.wait_for(asyncio.shield(app.lifecycle.drained.wait()), 0.2)
        assert [(m.name, m.leases) for m in cache.snapshot()] == [("addk_1", 1)]
        lease.release()
        async for progress in stream:
            seen.append(progress)
        assert (seen[-1].done, seen[-1].models_left, seen[-1].phase) == (True, 0, "done")
    await asyncio.wait_for(app.lifecycle.drained.wait(), 30)
    assert cache.snapshot() == []


async def test_a_node_drain_cut_short_by_the_node_dying_reports_it_and_can_be_retried(apps):
    app = apps["two nodes"]
    old = app.backends["node1"].cache
    await old.preload("addk_1")
    lease = await old.acquire("addk_1")
    [node1] = [n for n in app.supervisor.nodes if n.name == "node1"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.lifecycle.admin_port}") as channel:
        drain = rpc(channel, "Drain", admin_pb2.DrainProgress, streaming=True)
        stream = drain(admin_pb2.DrainRequest(node="node1"))
        async for progress in stream:
            if progress.phase == "unloading":
                break
        assert app.router.ring.nodes == ["node0"]
        os.kill(node1.pid, signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for progress in stream:
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "cache manager for node node1 stopped"
        lease.release()
        await until(lambda: (app.backends["node1"].cache not in (None, old)
                             and app.backends["node1"].healthy), 120, "node1 back with a new cache",
                    interval=0.05)
        progress = [p async for p in drain(admin_pb2.DrainRequest(node="node1"))]  # again: completes
        assert (progress[-1].done, progress[-1].models_left) == (True, 0)
    assert app.router.ring.nodes == ["node0"] and app.backends["node1"].cache.draining
