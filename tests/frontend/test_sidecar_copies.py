"""A sidecar cluster with copies that follow load, on both data planes (issue 31, item 7): a hot
model gains an extra copy on the peer sidecar's node, traffic reaches both copies with no request
failed, and once it cools down the extra copy is dropped and unloaded, again with none failed
(docs/copies.md, "Sidecars"; docs/data-plane.md, "Copies" and "Sidecars").

Two real nodes, two in-process sidecars (support/sidecars.py), with the Python data plane or each
with its own real HAProxy. Traffic goes through sidecar a's public ports (support/tfs_traffic.py:
gRPC and REST clients, official stubs). The copies rule runs on the rate signal with a clock the
test moves (support/gate.py ``Clock``): while it stands still a node's rate is exactly its count of
requests, so what the rule decides follows from the requests sent, never from timing; the
background sweep never runs (``sweep_s`` of an hour), the test sweeps itself.

The settings keep the extra copy to the hot model alone. ``min_load`` = 100: no node is over its
bound before a's front end has sent it 100 requests. ``hot_share`` = 0.9: a model is hot when its
rate per copy is at least 0.9 of a mean node's, which a model sent alone is, and one of three
models sent in turn by 8 clients never is past 100 requests (each client's count of a model is
within one of a third of its requests: a model's share is at most 1/3 + 8/T of T requests, under
0.45 for T > 70). So: HOT, sent alone, is over a's bound at its 101st request and gains its extra
copy on b; then L (a's, single copy) and P (b's, single copy) join it, and neither spreads, nor
does HOT again once it has cooled down.

On the HAProxy data plane, HOT with copies on both sidecars takes a's slow path (Python), which
balances it over a's node and b; L is routed by a's HAProxy to a's node and P to peer b, as the
stick table ``inflight`` of a's HAProxy shows (``L@a``, ``P@b``). Once the extra copy is dropped,
HOT is a's single copy and HAProxy routes it too. Every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from support.dataplane import routed_by_key, runtime_command
from support.gate import Clock
from support.sidecars import node_holds, predict, running_sidecars
from support.tfs_traffic import Traffic
from support.waiting import until
from tfscache.cluster.ring import Ring
from tfscache.dataplane import binary

from .conftest import emptied

HOT, L, P = "addk_6", "addk_2", "addk_1"  # ring orders over (a, b): (a, b), (a, b), (b, a)
MODELS = [HOT, L, P]
COOL_S = 100.0
SETTINGS = {"copies.signal": "rate", "copies.max_copies": 2, "copies.min_load": 100,
            "copies.hot_share": 0.9, "copies.balance": 0.25, "copies.cool_s": COOL_S,
            "copies.sweep_s": 3600}
CLIENTS = 8
SPREAD = 30  # HOT requests each copy takes through a while L and P run beside it
ROUTED = 20  # L's and P's requests a's HAProxy routes, on that data plane

NO_HAPROXY = "haproxy >= 2.6 is not installed (scripts/test.sh installs it)"
PLANES = [
    pytest.param("python", id="python"),
    pytest.param("haproxy", id="haproxy",
                 marks=pytest.mark.skipif(not binary.available(), reason=NO_HAPROXY)),
]


@pytest.fixture(params=PLANES)
async def cluster(request, nodes, frontend_repo, tmp_path):
    """Sidecars a and b over emptied nodes (the module's nodes serve each param), on one clock."""
    for node in nodes.values():
        await asyncio.to_thread(emptied, node, MODELS)
    clock = Clock()
    settings = {**SETTINGS, "server.data_plane": request.param}
    async with running_sidecars(nodes, frontend_repo, tmp_path, settings) as apps:
        for app in apps.values():
            app.spread.use_clock(clock)
        if request.param == "haproxy":  # each HAProxy reloaded with its peer (tables start afresh)
            for name, peer in (("a", "b"), ("b", "a")):
                await until(lambda name=name, peer=peer: f"grpc_{peer} " in runtime_command(
                    apps[name], "show servers state"), 30, f"{peer} in {name}'s HAProxy config")
        yield apps, clock, request.param


def test_the_models_ring_orders():
    ring = Ring(["a", "b"])
    assert ring.order(HOT) == ring.order(L) == ("a", "b") and ring.order(P) == ("b", "a")


@contextlib.asynccontextmanager
async def traffic_through(app, models):
    """``Traffic`` through ``app``'s public ports; its client threads are joined off the event
    loop, which serves their requests (the sidecar runs in this process)."""
    traffic = Traffic(f"127.0.0.1:{app.grpc_port}", f"http://127.0.0.1:{app.rest_port}", models,
                      clients=CLIENTS)
    traffic.__enter__()
    try:
        yield traffic
    finally:
        await asyncio.to_thread(traffic.__exit__, None, None, None)


def sent(app, model, node) -> float:
    """Requests for ``model`` ``app``'s copies rule counted on ``node`` (the clock stands still:
    the rate is the count)."""
    return app.spread.copies.rate((model, node))


async def test_a_hot_model_gains_a_copy_on_the_peer_and_loses_it_once_cool(cluster, nodes):
    apps, clock, plane = cluster
    a, b = apps["a"], apps["b"]

    # HOT alone through a: a's node until a is over its bound (min_load), then the rule adds b.
    for count in range(1, 400):
        response = await predict(a, HOT, float(count))
        assert list(response.outputs["y"].float_val) == [count + 6.0]
        if a.spread.counts():
            break
    assert a.spread.counts() == {HOT: ["a", "b"]}, f"{HOT} never spread in {count} requests"
    assert count > 100  # not before a's node was over min_load
    assert a.spread.added == {"b": 1}
    assert node_holds(nodes["b"], HOT)  # the request that added it went to b, which loaded it
    before = {node: sent(a, HOT, node) for node in "ab"}
    at_b = sent(b, HOT, "b")  # b counts what its own node serves, forwarded requests included
    # before its extra copy a's HAProxy may have routed HOT to a's node; from now on it may not
    routed_hot = routed_by_key(a).get(f"{HOT}@a", 0) if plane == "haproxy" else 0

    # HOT, L and P together: HOT over both copies, L and P on their one copy each.
    async with traffic_through(a, MODELS) as traffic:
        await until(lambda: all(sent(a, HOT, n) >= before[n] + SPREAD for n in "ab")
                    or traffic.failures(), 30, "HOT's requests on both copies")
        if plane == "haproxy":
            await until(lambda: (routed := routed_by_key(a)).get(f"{L}@a", 0) >= ROUTED
                        and routed.get(f"{P}@b", 0) >= ROUTED or traffic.failures(),
                        30, "L and P routed by a's HAProxy")
    traffic.check()
    assert sent(b, HOT, "b") >= at_b + SPREAD  # and b's node served them
    # L and P never spread
    assert a.spread.counts() == {HOT: ["a", "b"]} and a.spread.added == {"b": 1}
    assert not node_holds(nodes["a"], P) and not node_holds(nodes["b"], L)
    if plane == "haproxy":
        # HOT has a copy on a peer: a's HAProxy never routed it (the slow path balances it);
        # L and P, each with one copy, are in a's routes, to a's node and to peer b
        routed = routed_by_key(a)
        assert routed.get(f"{HOT}@a", 0) == routed_hot and f"{HOT}@b" not in routed
        assert HOT not in a.dataplane.routes.current and L in a.dataplane.routes.current
        assert a.dataplane.peer_routes.current.get(P) == "b"

    # Quiet for cool_s: a's sweep drops the extra copy, b's unloads it from b's node.
    clock.now += COOL_S + 1
    await a.spread.sweep()
    assert a.spread.counts() == {} and a.spread.removed == {"b": 1}
    assert await b.spread.sweep() == [(HOT, "b")]
    assert not node_holds(nodes["b"], HOT) and node_holds(nodes["a"], HOT)

    # Back to one copy: the same traffic, none failed, HOT on a's node alone.
    routed_hot = routed_by_key(a).get(f"{HOT}@a", 0) if plane == "haproxy" else 0
    at_a = sent(a, HOT, "a")
    async with traffic_through(a, MODELS) as traffic:
        if plane == "haproxy":  # HOT is a's single copy now: a's HAProxy routes it there
            await until(lambda: routed_by_key(a).get(f"{HOT}@a", 0) >= routed_hot + ROUTED
                        or traffic.failures(), 30, "HOT routed by a's HAProxy")
        else:
            await until(lambda: sent(a, HOT, "a") >= at_a + SPREAD or traffic.failures(), 30,
                        "HOT's requests on a's node")
    traffic.check()
    assert a.spread.counts() == {} and a.spread.added == {"b": 1}
    assert not node_holds(nodes["b"], HOT)
