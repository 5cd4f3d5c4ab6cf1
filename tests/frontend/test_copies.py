"""Copies that follow load, with real nodes: a hot model spreads to the next ring node and shrinks back.

Three real ``tfscache node`` processes, each behind an in-process sidecar (ServeApp), capped
at 2 models per node. Requests are held in flight by holding their model's load open on the
node's gate (--load_gate_dir), so the loads the rule sees are exact; the cool-down is driven
by a fake clock and an explicit ``Spread.sweep()`` (the background sweep is set to an hour).

addk_6's ring order is (a, b, c): its first copy is a, its extra copy goes to b, never c.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import generate_latest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from cache.cache_support import Gate, wait_for_condition
from support.node import start_node, version_status_at
from support.requests import predict_request
from support.sidecars import EMPTY, NODE_FLAGS, running_sidecars
from tfscache import settings as settings_mod
from tfscache.app import ServeApp
from tfscache.cluster.ring import Ring
from tfscache.observe.server import status_document

HOT, IN_FLIGHT, IDLE = "addk_6", "addk_0", "addk_4"  # ring orders (a, b, c), (b, a, c), (b, a, c)
NAMES = ("a", "b", "c")
COOL_S = 100.0
SETTINGS = {"copies.max_copies": 2, "copies.min_load": 1, "copies.hot_share": 0.5, "copies.balance": 0.25,
            "copies.cool_s": COOL_S, "copies.sweep_s": 3600, "cache.max_models_per_node": 2}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("copies-nodes")
    gates = {name: Gate(directory / f"gate-{name}") for name in NAMES}
    for gate in gates.values():
        gate.dir.mkdir()
    with start_node(directory, config=EMPTY, flags=[*NODE_FLAGS, f"--load_gate_dir={gates['a'].dir}"]) as a, \
            start_node(directory, config=EMPTY, flags=[*NODE_FLAGS, f"--load_gate_dir={gates['b'].dir}"]) as b, \
            start_node(directory, config=EMPTY, flags=[*NODE_FLAGS, f"--load_gate_dir={gates['c'].dir}"]) as c:
        a.gate, b.gate, c.gate = gates["a"], gates["b"], gates["c"]
        yield {"a": a, "b": b, "c": c}


@pytest.fixture
async def sidecars(three_nodes, frontend_repo, tmp_path):
    clock = Clock()
    async with running_sidecars(three_nodes, frontend_repo, tmp_path, SETTINGS) as apps:
        for app in apps.values():
            app.spread.use_clock(clock)
        yield apps, clock
    for node in three_nodes.values():
        node.gate.clear()


def test_the_models_ring_orders():
    ring = Ring(NAMES)
    assert ring.order(HOT) == ("a", "b", "c")
    assert ring.order(IN_FLIGHT)[0] == ring.order(IDLE)[0] == "b"


async def predict(app, name, x=1.0):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = await stub.Predict(predict_request(name, x), timeout=60)
        return list(response.outputs["y"].float_val)


def sent(app, model) -> int:
    """Requests for ``model`` this sidecar has in flight (to any node or peer)."""
    return sum(app.spread.copies.inflight(model, name) for name in app.topology.backends)


def held(app) -> int:
    """Versions counting against the cap on a sidecar's own node: loading and available."""
    node = app.topology.node(app.topology.own)
    return sum(1 for m in node.cache.snapshot() if m.state != "unloading")


def state(app, model):
    return app.topology.node(app.topology.own).cache.state_of(model, 1)


async def send_until_spread(app, model, tasks, limit=8) -> None:
    """Send requests for ``model`` through ``app`` one at a time, each held in flight, until ``app``
    routes it to two copies; at most ``limit``."""
    for _ in range(limit):
        if app.spread.counts().get(model):
            return
        before = sent(app, model)
        tasks.append(asyncio.create_task(predict(app, model)))
        await wait_for_condition(lambda: sent(app, model) == before + 1, what="the request in flight")
    raise AssertionError(f"{model} never spread through {app.topology.own}: {app.spread.counts()}")


async def test_a_hot_model_spreads_then_shrinks_back_and_sidecars_agree(sidecars, three_nodes):
    apps, clock = sidecars
    gates = {name: node.gate for name, node in three_nodes.items()}
    # b holds an idle model and a model with a request in flight (a lease held, as a request
    # holds it): its cap of 2 is full.
    assert await predict(apps["b"], IDLE) == [5.0]
    lease = await apps["b"].topology.node("b").cache.acquire(IN_FLIGHT, timeout=60)
    assert held(apps["b"]) == 2
    for gate in gates.values():
        gate.hold(HOT)
    tasks: list[asyncio.Task] = []
    # Through a: its own node until a is over its bound, then the next ring node, b.
    await send_until_spread(apps["a"], HOT, tasks)
    assert apps["a"].spread.counts() == {HOT: ["a", "b"]}
    await gates["a"].wait_until_waiting(HOT)
    await gates["b"].wait_until_waiting(HOT)  # b loads the copy: its idle model made room
    assert state(apps["b"], IDLE) in (None, "unloading") and state(apps["b"], IN_FLIGHT) == "available"
    # Through c and b, which learn of a's load only from their own requests: the same copies.
    await send_until_spread(apps["c"], HOT, tasks)
    await send_until_spread(apps["b"], HOT, tasks)
    for app in apps.values():
        assert app.spread.counts() == {HOT: ["a", "b"]}
        assert held(app) <= 2
    assert state(apps["c"], HOT) is None and not gates["c"].waiting(HOT)  # never more nodes than copies
    for gate in gates.values():
        gate.release(HOT)
    results = await asyncio.gather(*tasks)
    assert results == [[7.0]] * len(tasks)  # 0 failed requests
    lease.release()
    assert {name for name in NAMES if state(apps[name], HOT) == "available"} == {"a", "b"}
    assert sum(app.spread.spills.get("b", 0) for app in apps.values()) >= 3
    # Quiet for less than cool_s: nothing changes.
    clock.now += COOL_S - 1
    for app in apps.values():
        await app.spread.sweep()
        assert app.spread.counts() == {HOT: ["a", "b"]}
    assert state(apps["b"], HOT) == "available"
    # Quiet for cool_s: every sidecar drops the extra copy, and b's cache unloads it; a keeps its copy.
    clock.now += 2
    for app in apps.values():
        await app.spread.sweep()
        assert app.spread.counts() == {}
    assert state(apps["b"], HOT) is None and state(apps["a"], HOT) == "available"
    assert not any(s.state == 30 for s in version_status_at(three_nodes["b"].grpc_target, HOT))
    assert apps["b"].spread.unloaded == {"b": 1}
    # Back to one copy: the next requests go to a alone.
    for app in apps.values():
        assert await predict(app, HOT) == [7.0]
    assert state(apps["b"], HOT) is None
    for app in apps.values():
        assert held(app) <= 2


async def test_removal_waits_for_requests_in_flight(sidecars, three_nodes):
    apps, clock = sidecars
    b = apps["b"]
    assert await predict(b, HOT) == [7.0]  # through b: on a (its first copy)
    gate = three_nodes["b"].gate
    # An extra copy on b with a request in flight: put HOT on b by a forwarded request held open.
    gate.hold(HOT)
    task = asyncio.create_task(predict_forwarded(b, HOT))
    await gate.wait_until_waiting(HOT)
    clock.now += 10 * COOL_S
    assert await b.spread.sweep() == []  # loading, a request in flight: stays
    gate.release(HOT)
    assert await task == [7.0]
    assert state(b, HOT) == "available"
    clock.now += COOL_S / 2
    assert await b.spread.sweep() == []  # idle for less than cool_s since that request
    clock.now += COOL_S
    assert await b.spread.sweep() == [(HOT, "b")]
    assert state(b, HOT) is None


async def predict_forwarded(app, name):
    """A request marked as forwarded by a peer: the sidecar serves it from its own node."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = await stub.Predict(predict_request(name, 1.0), timeout=60,
                                      metadata=(("x-tfscache-forwarded", "a"),))
        return list(response.outputs["y"].float_val)


# -- embedded mode: one tfscache serve, two local node children ------------------------------

E_HOT, E_IDLE = "addk_6", "addk_0"  # ring orders over (node0, node1): (node0, node1), (node1, node0)


@pytest.fixture
async def embedded(frontend_repo, tmp_path):
    gate = Gate(tmp_path / "gate")
    gate.dir.mkdir()
    settings = settings_mod.load(env={}, overrides={
        "model_repository": str(frontend_repo), "node.local_nodes": 2, "server.bind_address": "127.0.0.1",
        "server.grpc_port": 0, "server.rest_port": 0, "server.grace_s": 1, "node.state_dir": str(tmp_path / "state"),
        "node.extra_args": [f"--load_gate_dir={gate.dir}"], **SETTINGS,
        "cache.max_models_per_node": 1})
    app = ServeApp(settings)
    await app.start()
    clock = Clock()
    app.spread.use_clock(clock)
    try:
        yield app, clock, gate
    finally:
        gate.clear()
        await app.stop(grace=1)


def embedded_state(app, node, model):
    return app.topology.node(node).cache.state_of(model, 1)


async def test_embedded_a_hot_model_spreads_then_shrinks_back(embedded):
    app, clock, gate = embedded
    assert Ring(["node0", "node1"]).order(E_HOT) == ("node0", "node1")
    assert Ring(["node0", "node1"]).owner(E_IDLE) == "node1"
    assert await predict(app, E_IDLE) == [1.0]  # node1's one slot (cap 1) holds an idle model
    gate.hold(E_HOT)
    tasks: list[asyncio.Task] = []
    await send_until_spread(app, E_HOT, tasks)
    assert app.spread.counts() == {E_HOT: ["node0", "node1"]}
    assert status_document(app.metrics, app.topology, spread=app.spread)["copies"] == {
        "min": 1, "max": 2, "models": {E_HOT: ["node0", "node1"]}}
    scrape = generate_latest(app.metrics.registry).decode()
    assert 'tfscache_copies_added_total{node="node1"} 1.0' in scrape
    assert 'tfscache_copy_spills_total{node="node1"} 1.0' in scrape
    assert "tfscache_extra_copies 1.0" in scrape
    await wait_for_condition(lambda: embedded_state(app, "node1", E_HOT) == "loading", what="the copy loading")
    assert embedded_state(app, "node1", E_IDLE) in (None, "unloading")  # the idle model made room
    assert held_at(app, "node1") <= 1  # the cap holds
    gate.release(E_HOT)
    assert await asyncio.gather(*tasks) == [[7.0]] * len(tasks)  # 0 failed requests
    for node in ("node0", "node1"):
        assert embedded_state(app, node, E_HOT) == "available"
        assert held_at(app, node) <= 1
    clock.now += COOL_S + 1
    assert await app.spread.sweep() == [(E_HOT, "node1")]
    assert app.spread.counts() == {}
    assert embedded_state(app, "node1", E_HOT) is None and embedded_state(app, "node0", E_HOT) == "available"
    assert await predict(app, E_HOT) == [7.0]
    assert embedded_state(app, "node1", E_HOT) is None
    assert app.spread.copies.removed == 1 and app.spread.added == {"node1": 1}
    scrape = generate_latest(app.metrics.registry).decode()
    assert 'tfscache_copies_removed_total{node="node1"} 1.0' in scrape
    assert 'tfscache_copies_unloaded_total{node="node1"} 1.0' in scrape
    assert "tfscache_extra_copies 0.0" in scrape


def held_at(app, node) -> int:
    """Versions counting against the cap on a local node: loading and available."""
    return sum(1 for m in app.topology.node(node).cache.snapshot() if m.state != "unloading")
