"""Sidecar topology: one tfscache per node, static peers, forwarding with at most one hop.

Two real nodes; the sidecars run in-process (ServeApp) so that each can be told the
other's port-0 address after both started, as discovery will do.
"""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.node import version_status_at
from support.requests import predict_request
from support.sidecars import node_holds, predict, running_sidecars, sidecar_settings
from tfscache.discovery import Peer
from tfscache.frontend.backends import FORWARDED_KEY
from tfscache.cluster.ring import Ring
from tfscache.app import ServeApp

@pytest.fixture
async def sidecars(nodes, frontend_repo, tmp_path):
    async with running_sidecars(nodes, frontend_repo, tmp_path) as apps:
        yield apps


async def test_requests_go_to_the_owning_sidecar(sidecars, nodes):
    ring = Ring(["a", "b"])
    models = [f"addk_{k}" for k in range(8)]
    assert {ring.owner(m) for m in models} == {"a", "b"}
    for i, name in enumerate(models):
        entry = "a" if i % 2 else "b"  # half through the owner, half through the other sidecar
        response = await predict(sidecars[entry], name, 10.0)
        assert (response.model_spec.name, list(response.outputs["y"].float_val)) == (name, [10.0 + int(name[5:])])
    for name in models:
        owner = ring.owner(name)
        other = "b" if owner == "a" else "a"
        assert node_holds(nodes[owner], name) and not node_holds(nodes[other], name), name
    # REST is forwarded to the owner's REST port too.
    name = next(m for m in models if ring.owner(m) == "b")
    async with aiohttp.ClientSession() as http:  # in-process sidecars: the client must not block the loop
        async with http.post(f"http://127.0.0.1:{sidecars['a'].rest_port}/v1/models/{name}:predict",
                             json={"instances": [1.0]}) as reply:
            assert (reply.status, await reply.json()) == (200, {"predictions": [1.0 + int(name[5:])]})


async def test_a_forwarded_request_is_served_locally_never_forwarded_again(sidecars, nodes):
    name = "saved_model_save"
    assert Ring(["a", "b"]).owner(name) == "b"
    # Marked as forwarded, a request to a is served by a's node although b owns the model.
    response = await predict(sidecars["a"], name, 2.0, metadata=((FORWARDED_KEY, "b"),))
    assert (response.model_spec.name, list(response.outputs["y"].float_val)) == (name, [12.0])
    assert node_holds(nodes["a"], name) and not node_holds(nodes["b"], name)


async def test_sidecars_that_disagree_about_owners_make_one_hop_not_a_loop(nodes, frontend_repo, tmp_path):
    # Both sidecars call themselves "a" and the other "b": each thinks the other owns the
    # models placed on "b". Without the forwarded mark a request would bounce for ever.
    name = "saved_model_save_multiple_signatures"
    assert Ring(["a", "b"]).owner(name) == "b"
    apps = {key: ServeApp(sidecar_settings("a", node, frontend_repo, tmp_path / key)) for key, node in nodes.items()}
    try:
        for app in apps.values():
            await app.start()
        for key, app in apps.items():
            other = apps["b" if key == "a" else "a"]
            await app.set_peers([Peer("a", f"127.0.0.1:{app.grpc_port}"), Peer("b", f"127.0.0.1:{other.grpc_port}")])
        response = await predict(apps["a"], name, 2.0)  # a -> b's sidecar (one hop) -> b's node
        assert (response.model_spec.name, list(response.outputs["y"].float_val)) == (name, [1.0])
        assert node_holds(nodes["b"], name) and not node_holds(nodes["a"], name)
    finally:
        for app in apps.values():
            await app.stop(grace=1)


async def test_a_peer_leaving_the_ring_lets_the_request_in_flight_to_it_finish(sidecars, nodes):
    # Discovery reports b gone (drained, deregistered) while a's request to b is still running:
    # a drops b from its ring, but the request already on b's channel gets its answer (closing
    # that channel at once used to leave the client waiting for its whole deadline).
    name = "addk_1"
    assert Ring(["a", "b"]).owner(name) == "b"
    a, gate = sidecars["a"], nodes["b"].gate
    gate.hold(name)
    try:
        call = asyncio.ensure_future(predict(a, name, 1.0))  # a -> b's sidecar -> b's node, held there
        await gate.wait_until_waiting(name)
        await a.set_peers([Peer("a", f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{a.rest_port}")])
        assert a.router.ring.nodes == ["a"]
        gate.release(name)
        response = await asyncio.wait_for(call, 30)
    finally:
        gate.release(name)
    assert (response.model_spec.name, list(response.outputs["y"].float_val)) == (name, [2.0])
    assert node_holds(nodes["b"], name) and not node_holds(nodes["a"], name)
    response = await predict(a, name, 3.0)  # a's ring is a alone now: its own node loads it
    assert list(response.outputs["y"].float_val) == [4.0] and node_holds(nodes["a"], name)
