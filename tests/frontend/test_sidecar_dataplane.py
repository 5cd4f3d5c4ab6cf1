"""Sidecars with `--data-plane haproxy`: a request for a model a peer owns goes from this
sidecar's HAProxy straight to the peer's public port (its HAProxy), marked as forwarded, and
the peer's data plane serves it (issue 31; docs/data-plane.md, "Sidecars").

Two real nodes, two in-process sidecars (support/sidecars.py), each with its own real HAProxy.
What HAProxy did is read from its stick tables over the runtime socket (support/dataplane.py)
and from the control plane's counters; what the Python front end did, from its counts of the
requests it forwarded (``tfscache_forwards`` less HAProxy's own). Every wait is on a condition.
"""

from __future__ import annotations

import aiohttp
import pytest

from support.dataplane import routed_by_key, runtime_command
from support.sidecars import node_holds, predict, running_sidecars
from support.waiting import until, within
from tfscache.cluster.ring import Ring
from tfscache.dataplane import binary
from tfscache.discovery import Peer
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY

pytestmark = pytest.mark.skipif(not binary.available(),
                                reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")

NAME = "addk_1"  # b owns it on the ring of a and b
HAPROXY = {"server.data_plane": "haproxy"}


@pytest.fixture
async def sidecars(nodes, frontend_repo, tmp_path):
    assert Ring(["a", "b"]).owner(NAME) == "b"
    async with running_sidecars(nodes, frontend_repo, tmp_path, HAPROXY) as apps:
        yield apps


def counted(app, family: str, node: str) -> int:
    return app.metrics.counts[family].get(node, 0)


def by_python(app, peer: str) -> int:
    """Requests the Python front end (the router) forwarded to ``peer``: every forward less those
    HAProxy routed there itself."""
    return counted(app, "tfscache_forwards", peer) - counted(app, "tfscache_dataplane_routed", peer)


def answered(app, protocol: str, method: str, code: str) -> float:
    return app.metrics.requests.labels(protocol, method, code)._value.get()


def serving_peer(app, peer: str) -> bool:
    """``app``'s HAProxy serves with ``peer``'s backend: the worker reloaded with it answers."""
    return f"grpc_{peer} " in runtime_command(app, "show servers state")


async def routed_to_peer(a, b) -> None:
    """The first request for NAME through a: the slow path, forwarded by a's Python front end to
    b, which loads it; then a's control plane routes NAME to b, and b's routes it to b's node.
    First each HAProxy is reloaded with its peer (a stick table starts empty on a reload)."""
    for app, peer in ((a, "b"), (b, "a")):
        await until(lambda: serving_peer(app, peer), 30, f"{peer} in the HAProxy configuration")
    response = await predict(a, NAME, 1.0)
    assert list(response.outputs["y"].float_val) == [2.0]
    assert by_python(a, "b") == 1
    await until(lambda: a.dataplane.peer_routes.current == {NAME: "b"}, 30,
                f"a's HAProxy routing {NAME} to b")
    await until(lambda: NAME in b.dataplane.routes.current, 30, f"b's HAProxy routing {NAME}")


async def test_a_request_for_a_model_a_peer_owns_goes_from_haproxy_to_the_peers_data_plane(
        sidecars, nodes):
    a, b = sidecars["a"], sidecars["b"]
    await routed_to_peer(a, b)
    at_b = routed_by_key(b).get(f"{NAME}@b", 0)
    ok = answered(a, "grpc", "Predict", "OK")

    response = await predict(a, NAME, 5.0)

    assert list(response.outputs["y"].float_val) == [6.0]
    assert routed_by_key(a).get(f"{NAME}@b") == 1  # a's HAProxy sent it to peer b
    assert routed_by_key(b).get(f"{NAME}@b") == at_b + 1  # b's HAProxy, to b's node
    # counted at a as a forward to b and a routed request, in the request metrics as Predict
    await until(lambda: counted(a, "tfscache_dataplane_routed", "b") == 1, 30,
                "a's poll counting the routed request")
    assert counted(a, "tfscache_forwards", "b") == 2 and by_python(a, "b") == 1
    await until(lambda: answered(a, "grpc", "Predict", "OK") == ok + 1, 30,
                "HAProxy's log line in a's request metrics")
    assert node_holds(nodes["b"], NAME) and not node_holds(nodes["a"], NAME)

    # REST too; the peer's report of its load is for a, not the client
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{a.rest_port}/v1/models/{NAME}:predict",
                             json={"instances": [2.0]}) as reply:
            assert (reply.status, await reply.json()) == (200, {"predictions": [3.0]})
            assert LOAD_KEY not in reply.headers
    assert routed_by_key(a).get(f"{NAME}@b") == 2
    await until(lambda: counted(a, "tfscache_dataplane_routed", "b") == 2, 30,
                "a's poll counting the routed REST request")
    assert by_python(a, "b") == 1  # a's Python front end forwarded the first request only
    assert not node_holds(nodes["a"], NAME)

    # a request a peer forwarded here is served here, never routed on: no loop
    response = await predict(a, NAME, 4.0, metadata=((FORWARDED_KEY, "b"),))
    assert list(response.outputs["y"].float_val) == [5.0]
    assert routed_by_key(a).get(f"{NAME}@b") == 2 and node_holds(nodes["a"], NAME)


async def test_a_peer_that_leaves_the_ring_loses_its_routes_and_requests_still_succeed(
        sidecars, nodes):
    a, b = sidecars["a"], sidecars["b"]
    await routed_to_peer(a, b)
    await a.set_peers([Peer("a", f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{a.rest_port}")])
    await until(lambda: not a.dataplane.peer_routes.current
                and not a.dataplane.supervisor.plan.peers, 30,
                "b's routes withdrawn and its backends gone from a's HAProxy")
    before = routed_by_key(a).get(f"{NAME}@b", 0)

    response = await predict(a, NAME, 3.0)  # a's ring is a alone: its own node loads it

    assert list(response.outputs["y"].float_val) == [4.0]
    assert node_holds(nodes["a"], NAME)
    assert routed_by_key(a).get(f"{NAME}@b", 0) == before


async def test_a_peer_stopped_while_routed_falls_back_to_the_python_front_end(sidecars, nodes):
    a, b = sidecars["a"], sidecars["b"]
    await routed_to_peer(a, b)
    del sidecars["b"]  # stopped here, not again by running_sidecars
    await within(b.stop(grace=0), 120, "b's stop")
    assert a.dataplane.peer_routes.current == {NAME: "b"}  # a still routes NAME to b

    for x in (7.0, 8.0):  # the first finds b's port closed; the next, b marked down
        response = await predict(a, NAME, x)
        assert list(response.outputs["y"].float_val) == [x + 1]
    # HAProxy sent them to b's backend, whose backup, a's Python front end, served them from
    # a's own node (they carry the forwarded mark, as they would have to b)
    assert routed_by_key(a).get(f"{NAME}@b") == 2
    assert node_holds(nodes["a"], NAME)
