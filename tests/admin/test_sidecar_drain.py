"""A sidecar drains: its own node's requests go to the next replica while its requests in flight finish.

Two real nodes, two in-process sidecars (ServeApp, as tests/frontend/test_sidecar.py) with
health and admin attached, ``replicas_per_model = 2``. A lease held on a's node stands for a
request in flight, so the drain is caught deterministically between "left the ring" and
"unloaded".
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2
import pytest

from support.sidecars import node_holds, predict
from support.node import started_nodes
from support.sidecars import EMPTY, NODE_FLAGS
from tfscache import settings as settings_mod
from tfscache.discovery import Peer
from tfscache.app import ServeApp
from tfscache.wire import admin_pb2


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sidecar-drain-nodes")
    with started_nodes(directory, [NODE_FLAGS, NODE_FLAGS], config=EMPTY) as (a, b):
        yield {"a": a, "b": b}


@pytest.fixture
async def sidecars(nodes, admin_repo, tmp_path):
    apps = {}
    for name, node in nodes.items():
        apps[name] = ServeApp(settings_mod.load(env={}, overrides={
            "model_repository": str(admin_repo), "node.node_address": f"127.0.0.1:{node.grpc_port},{node.rest_port}",
            "ring.self_name": name, "ring.replicas_per_model": 2, "server.bind_address": "127.0.0.1",
            "server.grpc_port": 0, "server.rest_port": 0, "server.grace_s": 1, "server.admin_port": 0,
            "node.state_dir": str(tmp_path / name)}))
        await apps[name].start()  # with health and the admin server: app.lifecycle
    peers = [Peer(name, f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.rest_port}") for name, app in apps.items()]
    for app in apps.values():
        await app.set_peers(peers)
    yield apps
    for app in apps.values():
        await app.lifecycle.shutdown(grace=0)


async def test_a_draining_sidecar_forwards_its_requests_and_finishes_those_in_flight(sidecars, nodes):
    a, b = sidecars["a"], sidecars["b"]
    cache = a.backends["a"].cache
    await cache.preload("addk_2")
    lease = await cache.acquire("addk_1")  # a request in flight on a's node
    async with grpc.aio.insecure_channel(f"127.0.0.1:{a.lifecycle.admin_port}") as channel:
        drain = channel.unary_stream("/tfscache.admin.Admin/Drain", request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=admin_pb2.DrainProgress.FromString)
        stream = drain(admin_pb2.DrainRequest(node="a"))  # a sidecar's own node: the process
        async for progress in stream:
            if progress.phase == "unloading" and progress.models_left == 1:
                break
        assert a.lifecycle.health.status("") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert b.lifecycle.health.status("") == health_pb2.HealthCheckResponse.SERVING
        assert a.router.ring.nodes == ["b"]  # a left its own ring
        join = channel.unary_unary("/tfscache.admin.Admin/Join", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=admin_pb2.JoinResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:  # a draining sidecar does not join again
            await join(admin_pb2.JoinRequest())
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                             "join: this tfscache is draining")
        assert a.router.ring.nodes == ["b"]
        # Requests still reaching a are served by b's node, for a cold model and for a's leased one.
        for name, k in (("addk_3", 3), ("addk_1", 1)):
            response = await predict(a, name, 1.0)
            assert list(response.outputs["y"].float_val) == [1.0 + k]
        assert node_holds(nodes["b"], "addk_3") and not node_holds(nodes["a"], "addk_3")
        assert [(m.name, m.leases) for m in cache.snapshot()] == [("addk_1", 1)]
        assert not a.lifecycle.drained.is_set()
        lease.release()  # the request in flight finishes: the drain completes
        async for progress in stream:
            last = progress
        assert (last.done, last.models_left) == (True, 0)
    await a.lifecycle.drained.wait()
    assert not node_holds(nodes["a"], "addk_1") and not node_holds(nodes["a"], "addk_2")


async def test_join_with_static_discovery_registers_nothing_and_says_so(sidecars):
    b = sidecars["b"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{b.lifecycle.admin_port}") as channel:
        join = channel.unary_unary("/tfscache.admin.Admin/Join", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=admin_pb2.JoinResponse.FromString)
        response = await join(admin_pb2.JoinRequest())
    assert not response.registered
    assert response.message.startswith("static discovery: nothing to register; ")
    assert b.router.ring.nodes == ["a", "b"]
