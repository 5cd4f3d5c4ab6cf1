"""Host-tier nodes (docs/tiers.md, "Host-tier nodes"), against real `tfscache node` children.

One `tfscache serve` (in-process ServeApp) with one GPU-tier node (node0, on the ring) and one
host-tier node (host0: off the ring, the GPU hidden from it), a count cap of one model per node
and ``cache.demote = host``. This machine has no GPU: node0's count cap stands in for its GPU
memory, which is what a GPU-tier node runs out of first; the hand-offs, the routing and the
unloads are the real ones. Loads are held open on the nodes' load gate (support.cache.Gate), so
each step is seen at a known point; clients are TF Serving's own stubs.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.cache import Gate, node_status
from support.node import node_template
from support.requests import predict_request
from support.waiting import until
from tfscache import settings as settings_mod
from tfscache.app import ServeApp
from tfscache.observe.server import status_document

A, B, C = "addk_1", "addk_2", "addk_3"  # y = x + 1, x + 2, x + 3


def serve_settings(frontend_repo, tmp_path, gate: Gate, **more):
    return settings_mod.load(env={}, overrides={
        "model_repository": str(frontend_repo), "node.local_nodes": 1,
        "node.local_host_nodes": 1, "server.bind_address": "127.0.0.1", "server.grpc_port": 0,
        "server.rest_port": 0, "server.grace_s": 1, "node.state_dir": str(tmp_path / "state"),
        "node.extra_args": [f"--load_gate_dir={gate.dir}"], "node.template_socket": node_template(),
        "cache.max_models_per_node": 1, "cache.demote": "host", **more})


@pytest.fixture
async def started(frontend_repo, tmp_path):
    """``start(**settings)``: the serve, started; stopped and its gate cleared at the end."""
    gate = Gate(tmp_path / "gate")
    gate.dir.mkdir()
    apps = []

    async def start(**more):
        app = ServeApp(serve_settings(frontend_repo, tmp_path, gate, **more))
        apps.append(app)
        await app.start()
        return app, gate

    try:
        yield start
    finally:
        gate.clear()
        for app in apps:
            await app.stop(grace=1)


async def predict(app, name, x=1.0) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = await stub.Predict(predict_request(name, x), timeout=60)
        return list(response.outputs["y"].float_val)


def state(app, node: str, model: str) -> str | None:
    return app.topology.node(node).cache.state_of(model, 1)


def resident(app, node: str, model: str):
    return next((m for m in app.topology.node(node).cache.snapshot() if m.name == model), None)


def counted(app, sample: str, **labels) -> float:
    """The sum of ``sample``'s values whose labels include ``labels``, as a scrape reads them."""
    text = generate_latest(app.metrics.registry).decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == sample and labels.items() <= s.labels.items())


# No promotion by rate in the first tests (a horizon of a millisecond never pays), so that what
# is seen is the demotion alone.
NO_RATE = {"cache.promote_horizon_s": 0.001}


async def test_a_victim_is_loaded_on_the_host_tier_then_routed_there_then_unloaded(started):
    app, gate = await started(**NO_RATE)
    assert app.topology.ring.nodes == ["node0"]  # the host tier is off the ring
    assert [b.name for b in app.topology.host_tier()] == ["host0"]
    assert await predict(app, A) == [2.0]
    assert (state(app, "node0", A), state(app, "host0", A)) == ("available", None)
    assert resident(app, "node0", A).tier == "gpu"

    # B needs node0's one slot: A, its idle victim, goes to host0 first. Held there, A is
    # still node0's and answers from node0.
    gate.hold(A)
    b = asyncio.create_task(predict(app, B))
    await gate.wait_until_waiting(A)
    assert state(app, "host0", A) == "loading"
    assert resident(app, "node0", A).moving == "host"
    assert await predict(app, A) == [2.0]  # answered during the move, from node0
    # B is admitted on A's room, and waits for it: node0 itself was not asked for B yet
    assert state(app, "node0", B) == "loading"
    node0 = app.topology.node("node0").upstream.grpc_address
    assert await asyncio.to_thread(node_status, node0, B) == {}
    gate.release(A)

    assert await b == [3.0]
    # A was held by host0 before node0 let it go; B loaded in its room.
    assert (state(app, "node0", A), state(app, "host0", A)) == (None, "available")
    assert state(app, "node0", B) == "available"
    assert resident(app, "host0", A).tier == "host"
    used = resident(app, "host0", A).last_use
    assert await predict(app, A) == [2.0]  # a request for the demoted model: host0 answers
    assert resident(app, "host0", A).last_use > used
    assert state(app, "node0", A) is None  # no cold load on node0
    assert counted(app, "tfscache_tier_moves_total", node="node0", to="host") == 1
    doc = status_document(app.metrics, app.topology)
    tiers = {n["name"]: n["tier"] for n in doc["nodes"]}
    assert tiers == {"node0": "gpu", "host0": "host"}
    host0 = next(n for n in doc["nodes"] if n["name"] == "host0")
    assert [(m["name"], m["tier"]) for m in host0["models"]] == [(A, "host")]


async def test_a_demoted_model_whose_promotion_pays_goes_back_to_its_gpu_node(started):
    # A horizon of 10^9 s: any request answered from host memory pays a promotion, once one
    # was served there (its service time there is known).
    app, gate = await started(**{"cache.promote_horizon_s": 1e9})
    assert await predict(app, A) == [2.0]
    assert await predict(app, B) == [3.0]
    assert state(app, "host0", A) == "available"

    # A's first request from host0 measures its service there; the next pays its promotion:
    # node0 loads A (held here) while host0 answers.
    gate.hold(A)
    assert await predict(app, A) == [2.0]
    assert resident(app, "host0", A).moving == ""
    assert await predict(app, A) == [2.0]
    await gate.wait_until_waiting(A)
    assert state(app, "node0", A) == "loading"
    assert resident(app, "host0", A).moving == "gpu"
    assert await predict(app, A) == [2.0]  # still from host0
    gate.release(A)

    # B, node0's victim, could not go to host0 (its one slot is A's until A has left): it was
    # unloaded, as a victim is without a host tier. A left host0 once node0 held it.
    await until(lambda: state(app, "host0", A) is None, 30.0, "A gone from host0")
    assert state(app, "node0", A) == "available"
    assert state(app, "node0", B) is None and state(app, "host0", B) is None
    assert await predict(app, A) == [2.0]
    assert counted(app, "tfscache_tier_moves_total", node="host0", to="gpu") == 1
    assert counted(app, "tfscache_tier_move_failures_total", node="node0", to="host") == 1


async def test_no_request_fails_while_more_models_than_the_gpu_tier_holds_churn(started):
    """Four clients over three models, one slot on node0 and one on host0, promotions paying at
    the first request from host memory: demotions, refused hand-offs, promotions and unloads all
    happen, and every request has its answer."""
    app, _ = await started(**{"cache.promote_horizon_s": 1e9})
    names = [A, B, C, A, B, A, C, C, A, B] * 3

    async def client(offset: int) -> list[tuple[str, list[float]]]:
        return [(n, await predict(app, n, 1.0)) for n in names[offset:] + names[:offset]]

    results = await asyncio.gather(*(client(i) for i in range(4)))
    expected = {A: [2.0], B: [3.0], C: [4.0]}
    assert all(answer == expected[name] for result in results for name, answer in result)
    assert sum(len(r) for r in results) == 4 * len(names)
    assert counted(app, "tfscache_tier_moves_total", to="host") >= 1  # demotions happened
    for node in ("node0", "host0"):  # the caps held: at most one model available on each
        assert sum(1 for m in app.topology.node(node).cache.snapshot()
                   if m.state == "available") <= 1


def test_settings_refuse_host_tier_nodes_where_they_cannot_work(frontend_repo, tmp_path):
    base = {"model_repository": str(frontend_repo), "cache.demote": "host"}
    with pytest.raises(settings_mod.SettingsError, match="needs host-tier nodes"):
        settings_mod.load(env={}, overrides=base)  # tfserving cannot demote in place
    assert settings_mod.load(env={}, overrides={**base, "node.local_host_nodes": 1})
    with pytest.raises(settings_mod.SettingsError, match="embedded mode only"):
        settings_mod.load(env={}, overrides={**base, "node.local_host_nodes": 1,
                                             "node.node_address": "10.0.0.2:8500",
                                             "ring.self_name": "a"})
    with pytest.raises(settings_mod.SettingsError, match="server.workers > 1"):
        settings_mod.load(env={}, overrides={**base, "node.local_host_nodes": 1,
                                             "server.workers": 2})
