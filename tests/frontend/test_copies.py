"""Copies that follow load, with real nodes: a hot model spreads to the next ring node and shrinks back.

Three real ``tfscache node`` processes, each behind an in-process sidecar (ServeApp), capped
at 2 models per node. Requests are held in flight by holding their model's load open on the
node's gate (--load_gate_dir), so the loads the rule sees are exact; the cool-down is driven
by a fake clock and explicit ``Spread.sweep()`` calls every SWEEP_S of fake time (the
background sweep is set to an hour).

The transient (docs/copies.md, "Sidecars"): the nodes holding the hot model (loading or
available) are sampled after every step; at most ``max_copies`` at once while hot, and the
dropped copy is unloaded at most ``cool_s + sweep_s`` after its last request.

addk_6's ring order is (a, b, c): its first copy is a, its extra copy goes to b, never c.
"""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from prometheus_client import generate_latest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.cache import Gate
from support.gate import Clock
from support.waiting import until
from support.node import node_template, start_node, version_status_at
from support.requests import predict_request
from support.sidecars import EMPTY, NODE_FLAGS, running_sidecars
from tfscache import settings as settings_mod
from tfscache.app import ServeApp
from tfscache.cluster.ring import Ring
from tfscache.frontend.backends import parse_load
from tfscache.observe.server import status_document

HOT, IN_FLIGHT, IDLE = "addk_6", "addk_0", "addk_4"  # ring orders (a, b, c), (b, a, c), (b, a, c)
NAMES = ("a", "b", "c")
COOL_S = 100.0
SWEEP_S = 5.0  # the sweep period the test plays with the fake clock (copies.sweep_s)
SETTINGS = {"copies.max_copies": 2, "copies.min_load": 1, "copies.hot_share": 0.5, "copies.balance": 0.25,
            "copies.cool_s": COOL_S, "copies.sweep_s": 3600, "cache.max_models_per_node": 2}


@pytest.fixture(scope="module")
def three_nodes(nodes, tmp_path_factory):
    """The package's two nodes (conftest's ``nodes``: a and b, emptied) and a third, c, of this module's."""
    directory = tmp_path_factory.mktemp("copies-node-c")
    gate = Gate(directory / "gate-c")
    gate.dir.mkdir()
    with start_node(directory, config=EMPTY, flags=[*NODE_FLAGS, f"--load_gate_dir={gate.dir}"]) as c:
        c.gate = gate
        yield {**nodes, "c": c}


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


async def send_until_spread(apps, via, model, tasks, limit=8) -> None:
    """Send requests for ``model`` through sidecar ``via`` one at a time, each held in flight, until it
    routes the model to two copies; at most ``limit``.

    Each request is sent once every earlier one has reached the node that serves it (a request
    forwarded to a peer is counted there only when it arrives), so that ``via``'s count grows by
    exactly the one request just sent."""
    app = apps[via]
    for _ in range(limit):
        if app.spread.counts().get(model):
            return
        await until(lambda: served(apps, model) == len(tasks), 30.0, "every request at its node")
        before = sent(app, model)
        task = asyncio.create_task(predict(app, model))
        tasks.append(task)
        await until(lambda task=task: served(apps, model) == len(tasks) or task.done(), 30.0,
                    "the request at its node")
        if task.done():  # it should be held in flight: say how it ended
            raise AssertionError(f"a held request for {model} through {via} ended: {task.result()}")
        assert sent(app, model) == before + 1
    raise AssertionError(f"{model} never spread through {via}: {app.spread.counts()}")


def served(apps, model) -> int:
    """Requests for ``model`` the sidecars' own nodes serve now (each request counts once, at the
    sidecar of the node that serves it, forwarded or not); embedded: all the front end has sent."""
    return sum(app.spread.copies.inflight(model, app.topology.own) if app.topology.own else sent(app, model)
               for app in apps.values())


def holders(apps, model) -> set[str]:
    """The nodes holding ``model`` now: loading or available on them."""
    return {name for name, app in apps.items() if state(app, model) in ("loading", "available")}


class Transient:
    """The most nodes that held a model at once, over the samples taken."""

    def __init__(self, apps, model) -> None:
        self.apps, self.model, self.most = apps, model, 0

    def sample(self) -> set[str]:
        now = holders(self.apps, self.model)
        self.most = max(self.most, len(now))
        return now


async def test_a_hot_model_spreads_then_shrinks_back_and_sidecars_agree(sidecars, three_nodes):
    apps, clock = sidecars
    gates = {name: node.gate for name, node in three_nodes.items()}
    transient = Transient(apps, HOT)
    # b holds an idle model and a model with a request in flight (a lease held, as a request
    # holds it): its cap of 2 is full.
    assert await predict(apps["b"], IDLE) == [5.0]
    lease = await apps["b"].topology.node("b").cache.acquire(IN_FLIGHT, timeout=60)
    assert held(apps["b"]) == 2
    for gate in gates.values():
        gate.hold(HOT)
    tasks: list[asyncio.Task] = []
    # Through a: its own node until a is over its bound, then the next ring node, b.
    await send_until_spread(apps, "a", HOT, tasks)
    assert apps["a"].spread.counts() == {HOT: ["a", "b"]}
    await gates["a"].wait_until_waiting(HOT)
    await gates["b"].wait_until_waiting(HOT)  # b loads the copy: its idle model made room
    transient.sample()
    assert state(apps["b"], IDLE) in (None, "unloading") and state(apps["b"], IN_FLIGHT) == "available"
    # Through c and b, which learn of a's load only from their own requests: the same copies.
    await send_until_spread(apps, "c", HOT, tasks)
    transient.sample()
    await send_until_spread(apps, "b", HOT, tasks)
    transient.sample()
    for app in apps.values():
        assert app.spread.counts() == {HOT: ["a", "b"]}
        assert held(app) <= 2
    assert state(apps["c"], HOT) is None and not gates["c"].waiting(HOT)  # never more nodes than copies
    for gate in gates.values():
        gate.release(HOT)
    results = await asyncio.gather(*tasks)
    assert results == [[7.0]] * len(tasks)  # 0 failed requests
    lease.release()
    assert transient.sample() == {"a", "b"}
    assert {name for name in NAMES if state(apps[name], HOT) == "available"} == {"a", "b"}
    assert sum(app.spread.spills.get("b", 0) for app in apps.values()) >= 3
    # Quiet: every SWEEP_S of fake time each sidecar sweeps. Nothing changes for cool_s; then every
    # sidecar drops the extra copy, and b's cache unloads it; a keeps its copy.
    quiet = 0.0
    while state(apps["b"], HOT) is not None:
        assert quiet <= COOL_S + SWEEP_S, f"b still holds {HOT} {quiet} s after its last request"
        clock.now += SWEEP_S
        quiet += SWEEP_S
        for app in apps.values():
            await app.spread.sweep()
            assert app.spread.counts() == ({HOT: ["a", "b"]} if quiet < COOL_S else {})
        assert transient.sample() <= {"a", "b"}
    # The dropped copy's time on b after its last request: within cool_s + sweep_s, at the first sweep
    # at or after cool_s (COOL_S is a multiple of SWEEP_S here: exactly cool_s).
    assert quiet == COOL_S <= COOL_S + SWEEP_S
    assert transient.most == 2  # never more nodes than max_copies, c never
    assert state(apps["a"], HOT) == "available"
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


# -- peer reports: a sidecar sends its node's load back on a forwarded answer ------------------

REPORT_MIN_LOAD = 4  # a node under 4 requests per window is never over: a sidecar alone needs 4 of its own


@pytest.fixture(params=[True, False], ids=["reports", "no-reports"])
async def reporting(request, three_nodes, frontend_repo, tmp_path):
    clock = Clock()
    settings = {**SETTINGS, "copies.min_load": REPORT_MIN_LOAD, "copies.peer_reports": request.param}
    async with running_sidecars(three_nodes, frontend_repo, tmp_path, settings) as apps:
        for app in apps.values():
            app.spread.use_clock(clock)
        yield apps, request.param


async def predict_rest(app, name, x=1.0):
    """A plain HTTP predict through ``app``: the predictions and the reply's headers."""
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{app.rest_port}/v1/models/{name}:predict", json={"instances": [x]},
            timeout=aiohttp.ClientTimeout(total=60)) as reply:
        assert reply.status == 200, await reply.text()
        return (await reply.json())["predictions"], reply.headers


async def test_two_sidecars_converge_on_the_same_copies_with_peer_reports(reporting):
    apps, reports = reporting
    a, c = apps["a"], apps["c"]
    # Through a: its own node takes REPORT_MIN_LOAD requests (the clock stands still: no decay),
    # then a is over its bound and the next one makes b an extra copy.
    for sent_through_a in range(1, 10):
        assert await predict(a, HOT) == [7.0]
        if a.spread.counts():
            break
    assert sent_through_a == REPORT_MIN_LOAD + 1 and a.spread.counts() == {HOT: ["a", "b"]}
    # Through c: its first request goes to a (c has sent nothing yet), over REST; a serves it and
    # reports its own node's load, every request a's node served, on the answer.
    assert c.spread.copies.load("a") == 0
    predictions, headers = await predict_rest(c, HOT)
    assert predictions == [7.0]
    assert "x-tfscache-load" not in headers  # the report is for c, not c's client
    if reports:
        assert c.spread.copies.reported("a") == REPORT_MIN_LOAD + 1
        assert c.spread.copies.load("a") == REPORT_MIN_LOAD + 1
    else:
        assert c.spread.copies.reported("a") is None and c.spread.copies.load("a") == 1
    # c's second request, over gRPC: with the report c sees a over its bound and takes b, the copy a
    # chose; without it c still sees a as it sees its own single request, and stays on a.
    assert await predict(c, HOT) == [7.0]
    if reports:
        assert c.spread.counts() == a.spread.counts() == {HOT: ["a", "b"]}
        assert c.spread.copies.reported("b") == 2  # a's request and c's, both served by b's node
        assert holders(apps, HOT) == {"a", "b"}  # never c
    else:
        assert c.spread.counts() == {} and a.spread.counts() == {HOT: ["a", "b"]}
        assert c.spread.copies.reported("b") is None
        # c alone: it spreads once it has sent a as many requests as a did itself.
        for sent_through_c in range(3, 10):
            assert await predict(c, HOT) == [7.0]
            if c.spread.counts():
                break
        assert sent_through_c == REPORT_MIN_LOAD + 1 and c.spread.counts() == {HOT: ["a", "b"]}
        assert c.spread.copies.reported("a") is None
    assert state(c, HOT) is None


async def test_a_forwarded_answer_carries_the_nodes_load(reporting):
    apps, _ = reporting
    a = apps["a"]
    assert await predict(a, HOT) == [7.0]  # a's own node: a load of 1 request (the clock stands still)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{a.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        call = stub.Predict(predict_request(HOT, 1.0), timeout=60, metadata=(("x-tfscache-forwarded", "c"),))
        assert list((await call).outputs["y"].float_val) == [7.0]
        trailing = dict(await call.trailing_metadata())
        plain = stub.Predict(predict_request(HOT, 1.0), timeout=60)
        await plain
        assert "x-tfscache-load" not in dict(await plain.trailing_metadata())  # only a forwarded answer
    assert trailing["x-tfscache-load"] == "2"  # the request before and this one
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{a.rest_port}/v1/models/{HOT}:predict", json={"instances": [1.0]},
            headers={"x-tfscache-forwarded": "c"}) as reply:
        assert reply.status == 200 and reply.headers["x-tfscache-load"] == "4"
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{a.rest_port}/v1/models/nope:predict", json={"instances": [1.0]},
            headers={"x-tfscache-forwarded": "c"}) as reply:
        assert reply.status == 404 and "x-tfscache-load" not in reply.headers  # errors carry none


@pytest.mark.parametrize("value, load", [("3", 3.0), ("0.25", 0.25), ("0", 0.0), (None, None), ("", None),
                                         ("-1", None), ("nan", None), ("inf", None), ("many", None)])
def test_a_load_report_is_read_or_ignored(value, load):
    assert parse_load(value) == load


# -- embedded mode: one tfscache serve, two local node children ------------------------------

E_HOT, E_IDLE = "addk_6", "addk_0"  # ring orders over (node0, node1): (node0, node1), (node1, node0)


@pytest.fixture
async def embedded(frontend_repo, tmp_path):
    gate = Gate(tmp_path / "gate")
    gate.dir.mkdir()
    settings = settings_mod.load(env={}, overrides={
        "model_repository": str(frontend_repo), "node.local_nodes": 2, "server.bind_address": "127.0.0.1",
        "server.grpc_port": 0, "server.rest_port": 0, "server.grace_s": 1, "node.state_dir": str(tmp_path / "state"),
        "node.extra_args": [f"--load_gate_dir={gate.dir}"], "node.template_socket": node_template(), **SETTINGS,
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
    await send_until_spread({"embedded": app}, "embedded", E_HOT, tasks)
    assert app.spread.counts() == {E_HOT: ["node0", "node1"]}
    assert status_document(app.metrics, app.topology, spread=app.spread)["copies"] == {
        "min": 1, "max": 2, "models": {E_HOT: ["node0", "node1"]}}
    scrape = generate_latest(app.metrics.registry).decode()
    assert 'tfscache_copies_added_total{node="node1"} 1.0' in scrape
    assert 'tfscache_copy_spills_total{node="node1"} 1.0' in scrape
    assert "tfscache_extra_copies 1.0" in scrape
    await until(lambda: embedded_state(app, "node1", E_HOT) == "loading", 30.0, "the copy loading")
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
