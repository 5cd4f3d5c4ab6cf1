"""tfscache.frontend.health: grpcio-health-checking's servicer on a real grpc.aio server, in-process.

The status callable is a flag the test flips; Watch streams are read with a deadline,
so "nothing changed" is a short wait that fails when a status arrives.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tfscache.frontend.protocols.tfserving import PROTOCOL
from tfscache.frontend.health import Health

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
NAMES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")


@pytest.fixture
async def served():
    async with serving_health(poll_s=0.05) as served_:
        yield served_


@contextlib.asynccontextmanager
async def serving_health(poll_s: float):
    state = {"serving": True}
    health = Health(lambda: state["serving"], services=PROTOCOL.health_services, poll_s=poll_s)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([health.handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield state, health, health_pb2_grpc.HealthStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        await health.stop()


async def check(stub, service: str = "") -> int:
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


async def test_check_answers_every_served_name_live(served) -> None:
    state, _, stub = served
    assert [await check(stub, name) for name in NAMES] == [SERVING] * 3
    state["serving"] = False  # no poll needed: Check evaluates first
    assert [await check(stub, name) for name in NAMES] == [NOT_SERVING] * 3


async def test_check_and_a_new_watch_never_answer_a_stale_status() -> None:
    async with serving_health(poll_s=3600) as (state, _, stub):  # the poll never runs again
        state["serving"] = False
        call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await asyncio.wait_for(call.read(), 5)).status == NOT_SERVING
        state["serving"] = True
        assert await check(stub) == SERVING
        assert (await asyncio.wait_for(call.read(), 5)).status == SERVING  # the Check's refresh
        call.cancel()


async def test_unknown_service_is_not_found_by_name(served) -> None:
    _, _, stub = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(stub, "no.such.Service")
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "unknown service 'no.such.Service'")
    call = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert (await asyncio.wait_for(call.read(), 5)).status == SERVICE_UNKNOWN
    call.cancel()


async def test_watch_follows_the_status_and_draining_is_final(served) -> None:
    state, health, stub = served
    call = stub.Watch(health_pb2.HealthCheckRequest(service="tensorflow.serving.PredictionService"))
    assert (await asyncio.wait_for(call.read(), 5)).status == SERVING
    state["serving"] = False
    assert (await asyncio.wait_for(call.read(), 5)).status == NOT_SERVING
    state["serving"] = True
    assert (await asyncio.wait_for(call.read(), 5)).status == SERVING
    health.set_draining()
    assert (await asyncio.wait_for(call.read(), 5)).status == NOT_SERVING
    assert health.draining and health.status() == NOT_SERVING
    assert [await check(stub, name) for name in NAMES] == [NOT_SERVING] * 3
    pending = asyncio.ensure_future(call.read())
    done, _ = await asyncio.wait([pending], timeout=0.3)  # serving() says yes; draining stays final
    assert not done
    call.cancel()
    with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
        await pending


def test_a_failing_status_callable_reads_as_not_serving(caplog) -> None:
    def broken() -> bool:
        raise RuntimeError("bug")

    health = Health(broken, services=PROTOCOL.health_services)
    assert health.status("") == NOT_SERVING
    assert health.status("other") == SERVICE_UNKNOWN
    assert "evaluating the status failed" in caplog.text
