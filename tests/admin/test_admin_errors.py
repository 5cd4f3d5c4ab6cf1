"""The admin service's one error mapping, in-process against a service whose methods fail.

Our errors keep their gRPC code and text; anything else is INTERNAL with a generic text and
the traceback in the log; a stream that fails after its first message ends with the mapped
status; the server goes on serving after each.
"""

from __future__ import annotations

import logging

import grpc
import pytest

from tfscache import errors
from tfscache.admin.server import SERVICE, _Handlers
from tfscache.wire import admin_pb2


class FailingService:
    """AdminService's methods: Pin fails with our error, ListModels with a bug, Drain midway."""

    async def ListModels(self, request):
        raise KeyError("a bug")

    async def Pin(self, request):
        raise errors.NotFound(f"model {request.name} is not in the repository")

    async def Preload(self, request):
        return admin_pb2.ModelResponse()

    async def Drain(self, request):
        yield admin_pb2.DrainProgress(phase="leaving")
        raise RuntimeError("another bug")

    Unpin = Evict = Join = Preload


@pytest.fixture
async def call():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_Handlers(FailingService(), token="")])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    def method(name, response_type, stream=False):
        make = channel.unary_stream if stream else channel.unary_unary
        return make(f"/{SERVICE}/{name}", request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response_type.FromString)

    yield method
    await channel.close()
    await server.stop(0)


async def test_our_errors_keep_code_and_text_others_are_internal(call, caplog):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call("Pin", admin_pb2.ModelResponse)(admin_pb2.ModelRequest(name="nope"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "model nope is not in the repository")
    with caplog.at_level(logging.ERROR, logger="tfscache.admin"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call("ListModels", admin_pb2.ListModelsResponse)(admin_pb2.ListModelsRequest(), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INTERNAL, "internal error in tfscache admin service")
    assert "admin ListModels failed" in caplog.text and "KeyError: 'a bug'" in caplog.text
    assert await call("Preload", admin_pb2.ModelResponse)(admin_pb2.ModelRequest(name="m"), timeout=10) == (
        admin_pb2.ModelResponse())  # still serving


async def test_a_stream_that_fails_midway_ends_with_internal(call):
    stream = call("Drain", admin_pb2.DrainProgress, stream=True)(admin_pb2.DrainRequest(), timeout=10)
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for message in stream:
            received.append(message.phase)
    assert received == ["leaving"]
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INTERNAL, "internal error in tfscache admin service")
