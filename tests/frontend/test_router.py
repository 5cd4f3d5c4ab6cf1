"""Router and gRPC adapter against recording upstream servers: replica order, one retry on
UNAVAILABLE, deadline and metadata propagation, and the one error mapping.

The upstreams are real grpc.aio servers that record what reaches them and answer as
told; the caches are fakes with CacheManager's interface (acquire / is_resident /
healthy), because what is tested here is the routing, not loading.
"""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from support.fakecache import FakeCache, resident
from tfscache import errors
from tfscache.frontend.backends import NodeBackend
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.protocols.tfserving import PROTOCOL
from tfscache.frontend.router import Router
from tfscache.frontend.upstream import Upstream
from tfscache.cluster.ring import Ring
from tfscache.wire import serving_pb2

PREDICT = "/tensorflow.serving.PredictionService/Predict"


class RecordingServer:
    """A gRPC server taking any method as bytes; records calls and answers with ``reply``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[dict] = []
        self.gate: asyncio.Event | None = None  # set: each call waits for it before answering
        self.arrived = asyncio.Event()  # a call has reached the server
        self.cancelled = asyncio.Event()  # a call was cancelled while it waited at the gate
        self.reply = lambda request: b"from-" + name.encode()
        self.server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(self._handle)
        outer = self

        class Generic(grpc.GenericRpcHandler):
            def service(self, details):
                outer._method = details.method
                return handler

        self.server.add_generic_rpc_handlers([Generic()])
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def _handle(self, request: bytes, context):
        self.calls.append({"method": self._method, "request": request,
                           "metadata": dict(context.invocation_metadata()),
                           "time_remaining": context.time_remaining()})
        self.arrived.set()
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        result = self.reply(request)
        if isinstance(result, errors.TfscacheError):
            await context.abort(result.grpc_code, result.message)
        return result


@pytest.fixture
async def world():
    """Three recording nodes n0..n2, a router with 2 replicas per model, a gRPC front end."""
    servers = {f"n{i}": RecordingServer(f"n{i}") for i in range(3)}
    for server in servers.values():
        await server.server.start()
    http = aiohttp.ClientSession()
    backends = {}
    for name, server in servers.items():
        upstream = Upstream(f"127.0.0.1:{server.port}", None, http, max_send_bytes=1 << 20,
                            max_receive_bytes=1 << 20)
        backends[name] = NodeBackend(name, upstream, FakeCache())
    router = Router(Ring(backends, replicas=2), backends)
    frontend = GrpcFrontend(router, bind_address="127.0.0.1", port=0, max_send_bytes=1 << 20,
                            max_receive_bytes=1 << 20, protocol=PROTOCOL)
    port = await frontend.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield {"servers": servers, "router": router, "backends": backends, "predict": channel.unary_unary(PREDICT)}
    await channel.close()
    await frontend.stop(0)
    await router.close()
    await http.close()
    for server in servers.values():
        await server.server.stop(0)


def request_for(name: str, version: int | None = None) -> bytes:
    spec = serving_pb2.ModelSpec(name=name)
    if version is not None:
        spec.version.value = version
    return serving_pb2.SpecHead(model_spec=spec).SerializeToString() + b"\x12\x03abc"  # plus an unknown field


def replicas(world, name):
    return world["router"].ring.replicas_for(name)


async def test_bytes_go_to_the_first_replica_unchanged(world):
    request = request_for("m1", 7)
    first, second = replicas(world, "m1")
    assert await world["predict"](request, timeout=10) == f"from-{first}".encode()
    assert world["servers"][first].calls[0]["request"] == request
    assert world["servers"][first].calls[0]["method"] == PREDICT
    assert world["backends"][first].cache.acquired[0][:2] == ("m1", 7)
    assert not world["servers"][second].calls


async def test_resident_replica_first_and_unhealthy_last(world):
    first, second = replicas(world, "m2")
    world["backends"][second].cache.models.append(resident("m2"))
    assert await world["predict"](request_for("m2"), timeout=10) == f"from-{second}".encode()
    world["backends"][second].cache.healthy = False
    assert await world["predict"](request_for("m2"), timeout=10) == f"from-{first}".encode()


async def test_deadline_and_metadata_propagate(world):
    first, _ = replicas(world, "m3")
    await world["predict"](request_for("m3"), timeout=5, metadata=(("x-request-id", "abc-123"),))
    call = world["servers"][first].calls[0]
    assert call["metadata"]["x-request-id"] == "abc-123"
    # grpc-timeout travels rounded up to its unit, so allow a little over 5 s.
    assert 3.0 < call["time_remaining"] <= 5.05
    assert 3.0 < world["backends"][first].cache.acquired[0][2] <= 5.05  # the load waits no longer either


async def test_unavailable_tries_the_next_replica_then_retries_a_few_rounds(world):
    first, second = replicas(world, "m4")
    world["servers"][first].reply = lambda r: errors.Unavailable("node going away")
    assert await world["predict"](request_for("m4"), timeout=10) == f"from-{second}".encode()
    world["servers"][second].reply = lambda r: errors.Unavailable("second one down too")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m4"), timeout=10)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, "second one down too")
    # Both answer UNAVAILABLE while connected: each is tried again in 3 more rounds, with a backoff.
    assert len(world["servers"][first].calls) == 2 + 3 and len(world["servers"][second].calls) == 1 + 4
    third = next(n for n in world["servers"] if n not in (first, second))
    assert not world["servers"][third].calls  # never outside the replicas


async def test_a_call_the_node_cancelled_tries_the_next_replica_once(world):
    first, second = replicas(world, "m8")
    world["servers"][first].reply = lambda r: errors.Cancelled("server shutting down")
    assert await world["predict"](request_for("m8"), timeout=10) == f"from-{second}".encode()
    assert len(world["servers"][first].calls) == 1 and len(world["servers"][second].calls) == 1


async def test_other_node_errors_pass_through_without_retry(world):
    first, second = replicas(world, "m5")
    world["servers"][first].reply = lambda r: errors.FailedPrecondition('Serving signature key "s" not found.')
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m5"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "s" not found.')
    assert not world["servers"][second].calls


async def test_cache_errors_and_unexpected_errors_are_mapped_once(world):
    first, _ = replicas(world, "m6")

    async def refuse(name, version=None, timeout=None):
        raise errors.CapacityExhausted("node n: 2 of 2 models, all busy")

    world["backends"][first].cache.acquire = refuse
    world["backends"][replicas(world, "m6")[1]].cache.acquire = refuse
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m6"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "node n: 2 of 2 models, all busy")

    async def broken(name, version=None, timeout=None):
        raise KeyError("bug")

    world["backends"][first].cache.acquire = broken
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m6"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INTERNAL, "internal error in tfscache front end")
    # The server keeps serving.
    del world["backends"][first].cache.acquire  # back to FakeCache.acquire
    assert await world["predict"](request_for("m6"), timeout=10) == f"from-{first}".encode()


async def test_expired_deadline_while_loading(world):
    first, _ = replicas(world, "m7")
    gate = asyncio.Event()

    async def slow(name, version=None, timeout=None):
        try:  # the cache honours the deadline it is given, with DEADLINE_EXCEEDED as CacheManager does
            await asyncio.wait_for(gate.wait(), timeout)
        except asyncio.TimeoutError:
            raise errors.DeadlineExceeded("Deadline Exceeded") from None

    world["backends"][first].cache.acquire = slow
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m7"), timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert not world["servers"][first].calls


# -- calls in flight when a channel closes or the ring changes ------------------------------------
# A closed grpc.aio channel ends its calls with asyncio.CancelledError; escaping the front end's
# handler, that left the client waiting for its whole deadline (the cluster drain test's rare
# 60 s DEADLINE_EXCEEDED). The clients below would time out after 10 s if it happened again.


async def held_call(world, name: str, reply=None):
    """A Predict for ``name`` held at its first replica's gate: (the call, a future of its answer,
    that server, the replicas).

    ``reply``: what the held server answers once its gate opens (default: its name)."""
    first, second = replicas(world, name)
    held = world["servers"][first]
    held.gate = asyncio.Event()
    if reply is not None:
        held.reply = reply
    call = world["predict"](request_for(name), timeout=10)
    waiting = asyncio.ensure_future(call)
    await held.arrived.wait()
    return call, waiting, held, (first, second)


async def test_a_channel_closed_under_a_call_tries_the_next_replica(world):
    _, answer, held, (first, second) = await held_call(world, "c1")
    await world["backends"][first].upstream.close()  # as a node exiting or a peer leaving the ring used to
    assert await answer == f"from-{second}".encode()
    with pytest.raises(errors.NodeUnavailable, match="is closed"):  # and a call made after the close
        await world["backends"][first].upstream.unary(PREDICT, request_for("c1"), timeout=10)
    held.gate.set()


async def test_the_retry_goes_to_the_ring_as_it_is_after_the_first_try(world):
    _, answer, held, (first, second) = await held_call(world, "c2", reply=lambda r: errors.Unavailable("going away"))
    third = next(n for n in world["servers"] if n not in (first, second))
    world["router"].ring = Ring([first, third], replicas=2)  # second left the ring meanwhile
    held.gate.set()
    assert await answer == f"from-{third}".encode()
    assert not world["servers"][second].calls


async def test_retire_lets_the_calls_in_flight_finish_then_closes_the_channel(world):
    _, answer, held, (first, second) = await held_call(world, "c3")
    upstream = world["backends"][first].upstream
    retiring = asyncio.ensure_future(upstream.retire(30))
    held.gate.set()
    assert await answer == f"from-{first}".encode()  # answered by the retiring upstream, not retried
    await asyncio.wait_for(retiring, 10)
    assert not world["servers"][second].calls
    with pytest.raises(errors.NodeUnavailable, match="is closed"):
        await upstream.unary(PREDICT, request_for("c3"), timeout=10)


async def test_a_cancellation_from_inside_is_unavailable_not_a_hang(world):
    first, _ = replicas(world, "c4")

    async def cancelled(name, version=None, timeout=None):
        raise asyncio.CancelledError()  # no caller cancelled: a bug or a library's doing

    world["backends"][first].cache.acquire = cancelled
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("c4"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.UNAVAILABLE, "request cancelled inside tfscache; retry it")
    del world["backends"][first].cache.acquire
    assert await world["predict"](request_for("c4"), timeout=10) == f"from-{first}".encode()


async def test_a_client_cancelling_cancels_the_upstream_call_without_a_retry(world):
    call, waiting, held, (_, second) = await held_call(world, "c5")
    call.cancel()
    await asyncio.wait_for(held.cancelled.wait(), 10)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not world["servers"][second].calls


async def test_the_request_id_comes_back_in_the_trailing_metadata_ok_or_not(world):
    first, _ = replicas(world, "m20")
    call = world["predict"](request_for("m20"), timeout=10, metadata=(("x-request-id", "given-1"),))
    await call
    assert ("x-request-id", "given-1") in tuple(await call.trailing_metadata())
    call = world["predict"](request_for("m20"), timeout=10)
    await call
    made = dict(tuple(await call.trailing_metadata()))["x-request-id"]
    assert made and made == world["servers"][first].calls[-1]["metadata"]["x-request-id"]  # the id sent on
    world["servers"][first].reply = lambda r: errors.InvalidArgument("bad input")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["predict"](request_for("m20"), timeout=10, metadata=(("x-request-id", "given-2"),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("x-request-id", "given-2") in tuple(info.value.trailing_metadata())


async def test_retries_and_forwards_are_counted_per_backend(world):
    from prometheus_client import generate_latest

    from observe.promtext import Scrape
    from tfscache.observe.metrics import Metrics

    metrics = Metrics(process=False)
    router = world["router"]
    first, second = replicas(world, "m21")
    third = next(n for n in world["servers"] if n not in (first, second))
    router.metrics, router.local = metrics, third  # as a sidecar whose own node is the third
    metrics.watch(lambda: (), lambda: 3, lambda: list(world["backends"]))
    world["servers"][first].reply = lambda r: errors.Unavailable("node going away")
    assert await world["predict"](request_for("m21"), timeout=10) == f"from-{second}".encode()
    s = Scrape(generate_latest(metrics.registry).decode())
    assert s.value("tfscache_retries_total", node=first) == 1 and s.value("tfscache_retries_total", node=second) == 0
    assert s.value("tfscache_forwards_total", node=first) == s.value("tfscache_forwards_total", node=second) == 1
    assert s.value("tfscache_forwards_total", node=third) == 0  # every backend has its series


async def test_a_node_replaced_while_a_request_waits_for_it_serves_the_request(world):
    """Issue 23, the Triton kill flake: a request that found every replica down waits for one to
    connect again; the node's process is replaced meanwhile (serve detaches the backend, attaches
    the new process, closes the old channel). Closing a channel under ``channel_ready`` raises
    grpc's UsageError; it used to escape the router as INTERNAL "internal error in tfscache front
    end" (an InferenceServerException to the client). The request goes to the new process."""
    first, second = replicas(world, "r1")
    for name in (first, second):
        await world["servers"][name].server.stop(0)  # both replicas' processes die
    backend, old = world["backends"][first], world["backends"][first].upstream
    waiting = asyncio.Event()
    wait_serving = backend.wait_serving

    async def noted(timeout):
        waiting.set()
        return await wait_serving(timeout)

    backend.wait_serving = noted
    answer = asyncio.ensure_future(world["predict"](request_for("r1"), timeout=30))
    await asyncio.wait_for(waiting.wait(), 10)  # it tried both and waits for one to serve again

    async def failing():
        while old.channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            await asyncio.sleep(0.01)  # polling the channel's state, bounded by wait_for

    await asyncio.wait_for(failing(), 10)  # the state in which a close ends channel_ready with UsageError
    replacement = RecordingServer(first)
    await replacement.server.start()
    world["servers"][f"{first}-new"] = replacement  # stopped with the others
    backend.detach()  # as app/nodes.py's Nodes when a node exits, then starts again
    backend.attach(Upstream(f"127.0.0.1:{replacement.port}", None, old._http, max_send_bytes=1 << 20,
                            max_receive_bytes=1 << 20), FakeCache())
    await old.close()
    assert await asyncio.wait_for(answer, 30) == f"from-{first}".encode()
    assert len(replacement.calls) == 1


async def test_a_host_tier_node_that_holds_the_model_leads_when_no_replica_does(world):
    """Host-tier nodes (docs/tiers.md) are off the ring: a request goes to one only for a model it
    holds and no replica on the ring holds (a demoted model), and only while it is healthy."""
    router, backends = world["router"], world["backends"]
    router.update(Ring(["n0", "n1"], replicas=2), backends)
    router.host_tier = lambda: [backends["n2"]]
    first, second = router.ring.replicas_for("m9")
    assert await world["predict"](request_for("m9"), timeout=10) == f"from-{first}".encode()
    backends["n2"].cache.models.append(resident("m9"))  # demoted to the host tier
    assert await world["predict"](request_for("m9"), timeout=10) == b"from-n2"
    backends[second].cache.models.append(resident("m9"))  # back on a replica on the ring
    assert await world["predict"](request_for("m9"), timeout=10) == f"from-{second}".encode()
    backends[second].cache.models.clear()
    backends["n2"].cache.healthy = False
    assert await world["predict"](request_for("m9"), timeout=10) == f"from-{first}".encode()
    assert not world["servers"]["n2"].calls[1:]  # one request reached it, while it held m9
