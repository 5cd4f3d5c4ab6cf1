"""Sidecars with `--data-plane haproxy`: a request for a model a peer owns goes from this
sidecar's HAProxy straight to the peer's public port (its HAProxy), marked as forwarded, and
the peer's data plane serves it (issue 31; docs/data-plane.md, "Sidecars").

Two real nodes, two in-process sidecars (support/sidecars.py), each with its own real HAProxy.
What HAProxy did is read from its stick tables over the runtime socket (support/dataplane.py)
and from the control plane's counters; what the Python front end did, from its counts of the
requests it forwarded (``tfscache_forwards`` less HAProxy's own). Every wait is on a condition.
"""

from __future__ import annotations

import collections

import aiohttp
import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.dataplane import routed_by_key, runtime_command, served_with_peer, serving_peer
from support.gate import Clock
from support.requests import predict_request
from support.sidecars import node_holds, predict, running_sidecars
from support.waiting import until, within
from tfscache.cluster.ring import Ring
from tfscache.dataplane import binary, control
from tfscache.discovery import Peer
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY, VIA_DATA_PLANE, VIA_KEY

pytestmark = pytest.mark.skipif(not binary.available(),
                                reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")

NAME = "addk_1"  # b owns it on the ring of a and b
B_OWNS, A_OWNS = "addk_3", "addk_2"  # on the same ring; used by the tests below NAME's only
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


async def routed_to_peer(a, b) -> None:
    """The first request for NAME through a: the slow path, forwarded by a's Python front end to
    b, which loads it; then a's control plane routes NAME to b, and b's routes it to b's node.
    First each HAProxy is reloaded with its peer (a stick table starts empty on a reload)."""
    for app, peer in ((a, "b"), (b, "a")):
        await until(lambda: served_with_peer(app, peer), 30, f"{peer} in the HAProxy configuration")
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


# -- the table missed: read once a second, and cleared of what was handled -------------------------

@pytest.fixture
async def clocked(nodes, frontend_repo, tmp_path):
    """Sidecars a and b; a's control plane reads HAProxy's table ``missed`` on a clock the test
    moves, so it reads it only when the test moved the clock by ``MISSED_EVERY_S``."""
    clock = Clock()

    def prepare(name, app):
        if name == "a":
            app.dataplane.clock = clock

    async with running_sidecars(nodes, frontend_repo, tmp_path, HAPROXY, prepare=prepare) as apps:
        for app, peer in ((apps["a"], "b"), (apps["b"], "a")):
            await until(lambda app=app, peer=peer: served_with_peer(app, peer), 30,
                        f"{peer} in the HAProxy configuration")
        yield apps, clock


def count_reads(runtime, monkeypatch) -> collections.Counter:
    """Stick tables read through ``runtime`` from now on, by name (the real reads, counted)."""
    reads, real = collections.Counter(), runtime.table

    async def table(name):
        reads[name] += 1
        return await real(name)

    monkeypatch.setattr(runtime, "table", table)
    return reads


def missed_in_haproxy(app) -> set[str]:
    """The keys of the table ``missed`` of ``app``'s HAProxy, as it has them now."""
    return {line.split("key=", 1)[1].split()[0]
            for line in runtime_command(app, "show table missed").splitlines() if "key=" in line}


async def polls(reads, count: int) -> None:
    """Wait for ``count`` more polls of the control plane: each reads the table ``inflight``."""
    start = reads["inflight"]
    await until(lambda: reads["inflight"] >= start + count, 30, f"{count} polls")


async def reloaded(app, reads) -> None:
    """Once ``app``'s control plane started a reload (its plan changed): the poll that reloads
    is over, and the new worker alone serves (its tables start empty)."""
    await polls(reads, 2)  # the second one starts once the reload's poll is done
    await until(app.dataplane.supervisor.old_workers_gone, 30, "the old HAProxy worker gone")


async def test_the_missed_table_is_read_once_a_second_and_cleared_of_each_model_handled(
        clocked, nodes, monkeypatch):
    (apps, clock), every = clocked, control.MISSED_EVERY_S
    a = apps["a"]
    reads = count_reads(a.dataplane.routes.runtime, monkeypatch)
    await polls(reads, 2)
    base = reads["missed"]  # none since the test's clock last moved (it has not yet: 0)
    clock.now += every  # one read at the next poll, then none while the clock stands still
    await until(lambda: reads["missed"] == base + 1, 30, "a's control plane reading missed")

    # two requests with no route: the slow path forwards B_OWNS to b, and loads A_OWNS here
    assert list((await predict(a, B_OWNS, 1.0)).outputs["y"].float_val) == [4.0]
    assert list((await predict(a, A_OWNS, 1.0)).outputs["y"].float_val) == [3.0]
    assert missed_in_haproxy(a) == {B_OWNS, A_OWNS}
    await polls(reads, 20)  # 2 s of polls, at 100 ms: no read, so no peer route yet
    assert reads["missed"] == base + 1 and a.dataplane.peer_routes.current == {}
    await until(lambda: A_OWNS in a.dataplane.routes.current, 30, f"a routing {A_OWNS} locally")

    clock.now += every  # the next poll reads both, routes B_OWNS to b, and clears both
    await until(lambda: a.dataplane.peer_routes.current == {B_OWNS: "b"}, 30,
                f"a's HAProxy routing {B_OWNS} to b")
    await until(lambda: not missed_in_haproxy(a), 30, "both cleared from a's table missed")
    await polls(reads, 20)  # the route stays, though its model left the table
    assert reads["missed"] == base + 2 and a.dataplane.peer_routes.current == {B_OWNS: "b"}

    # a's HAProxy now sends B_OWNS to b, and counts it nowhere in missed
    assert list((await predict(a, B_OWNS, 2.0)).outputs["y"].float_val) == [5.0]
    assert routed_by_key(a).get(f"{B_OWNS}@b") == 1 and not missed_in_haproxy(a)

    # a reload that keeps b (b's REST address dropped: its backends change) starts the tables
    # afresh, and keeps the route: a remembers the models it routed
    both = [Peer(n, f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.rest_port}")
            for n, app in apps.items()]
    await a.set_peers([both[0], Peer("b", both[1].grpc)])
    await until(lambda: [p.rest for p in a.dataplane.supervisor.plan.peers] == [""], 30,
                "a's HAProxy reloaded with b's gRPC backend alone")
    await reloaded(a, reads)
    await polls(reads, 5)
    assert a.dataplane.peer_routes.current == {B_OWNS: "b"} and routed_by_key(a) == {}
    assert list((await predict(a, B_OWNS, 2.0)).outputs["y"].float_val) == [5.0]
    assert routed_by_key(a).get(f"{B_OWNS}@b") == 1 and not missed_in_haproxy(a)

    # b leaves: a serves B_OWNS itself; asked for with no route, it is in missed, read, cleared
    await a.set_peers(both[:1])
    await until(lambda: not a.dataplane.peer_routes.current
                and not a.dataplane.supervisor.plan.peers, 30, "b gone from a's HAProxy")
    await reloaded(a, reads)
    assert list((await predict(a, B_OWNS, 3.0)).outputs["y"].float_val) == [6.0]
    assert node_holds(nodes["a"], B_OWNS) and missed_in_haproxy(a) == {B_OWNS}
    clock.now += every
    await until(lambda: not missed_in_haproxy(a), 30, f"{B_OWNS} cleared, no peer owning it")
    assert a.dataplane.peer_routes.current == {}
    # b joins again: the model cleared meanwhile is not lost, its next request is in missed again
    await a.set_peers(both)
    await until(lambda: serving_peer(a, "b") and B_OWNS not in a.dataplane.routes.current, 30,
                f"b back in a's HAProxy, and a's own route of {B_OWNS} withdrawn (b's on the ring)")
    await reloaded(a, reads)
    assert list((await predict(a, B_OWNS, 4.0)).outputs["y"].float_val) == [7.0]
    assert missed_in_haproxy(a) == {B_OWNS}
    clock.now += every
    await until(lambda: a.dataplane.peer_routes.current == {B_OWNS: "b"}
                and not missed_in_haproxy(a), 30, f"{B_OWNS} routed to b again, and cleared")


# -- the peer's load report is for a's Python path, never for a's HAProxy's clients ----------------

COPIES = {"copies.max_copies": 2, "copies.min_load": 1000}  # copies on, none ever added


@pytest.fixture
async def mixed(nodes, frontend_repo, tmp_path):
    """Sidecar a on HAProxy, b on the Python data plane (its public ports are its front ends,
    which report b's node's load on the answer to what a peer forwarded), copies on in both (no
    report without)."""
    async with running_sidecars(nodes, frontend_repo, tmp_path, COPIES,
                                each={"a": HAPROXY}) as apps:
        await until(lambda: served_with_peer(apps["a"], "b"), 30, "b in a's HAProxy configuration")
        yield apps


async def predict_with_trailers(port: int, name: str, x: float, metadata=()) -> tuple[list, dict]:
    """A Predict on ``port``: (its outputs, its trailing metadata)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request(name, x), timeout=60, metadata=metadata)
        reply = await call
        return list(reply.outputs["y"].float_val), dict(await call.trailing_metadata())


async def rest_load(port: int, name: str, headers: dict) -> str | None:
    """A REST predict of ``name`` on ``port`` with ``headers``: its load report, if any."""
    async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{port}/v1/models/{name}:predict", json={"instances": [1.0]},
            headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        return reply.headers.get(LOAD_KEY)


async def test_a_peer_sends_its_load_report_to_the_python_path_not_to_haproxys_clients(mixed):
    a, b = mixed["a"], mixed["b"]
    assert a.dataplane is not None and b.dataplane is None
    # the first request: a's slow path forwards it to b, whose answer reports its load to a
    assert a.spread.copies.reported("b") is None
    outputs, trailers = await predict_with_trailers(a.grpc_port, B_OWNS, 1.0)
    assert outputs == [4.0] and LOAD_KEY not in trailers  # for a, not a's client
    assert a.spread.copies.reported("b") is not None
    await until(lambda: a.dataplane.peer_routes.current == {B_OWNS: "b"}, 30,
                f"a's HAProxy routing {B_OWNS} to b")

    # then a's HAProxy sends it to b's front end, saying so: b sends no report, which would have
    # reached a's client in the trailers
    outputs, trailers = await predict_with_trailers(a.grpc_port, B_OWNS, 2.0)
    assert outputs == [5.0] and LOAD_KEY not in trailers
    assert routed_by_key(a).get(f"{B_OWNS}@b") == 1
    assert await rest_load(a.rest_port, B_OWNS, {}) is None
    assert routed_by_key(a).get(f"{B_OWNS}@b") == 2

    # b's front end itself: a forward reports b's load, unless HAProxy sent it
    forwarded, via = (FORWARDED_KEY, "a"), (VIA_KEY, VIA_DATA_PLANE)
    assert LOAD_KEY in (await predict_with_trailers(b.grpc_port, B_OWNS, 1.0, (forwarded,)))[1]
    assert LOAD_KEY not in (await predict_with_trailers(b.grpc_port, B_OWNS, 1.0,
                                                         (forwarded, via)))[1]
    assert await rest_load(b.rest_port, B_OWNS, dict([forwarded])) is not None
    assert await rest_load(b.rest_port, B_OWNS, dict([forwarded, via])) is None
