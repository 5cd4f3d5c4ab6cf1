"""`tfscache serve --data-plane haproxy`: real HAProxy on the public ports, a real `tfscache
node`, the official TF Serving client.

The control plane runs in this test's process (``ServeApp``), so the test can read its routes
and HAProxy's stick table and evict through the cache as the admin API does. The ``gate`` model's
requests block inside the node until released (at the node itself), which holds a request in
flight on the data plane without timing anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import csv
import re
import threading

import grpc
import pytest
import requests
import pytest_asyncio
from prometheus_client import generate_latest
from support.models.tfserving import build_gate
from support.node import node_template, version_status_at
from support.requests import float_tensor, predict_request
from support.gate import predict_gate, release
from support.dataplane import serving
from support.serving import link_repository
from support.waiting import until
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tfscache import settings as settings_mod
from tfscache.dataplane import binary
from workers.conftest import StatusSampler

pytestmark = [
    pytest.mark.skipif(not binary.available(),
                       reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"),
    pytest.mark.asyncio(loop_scope="module"),
]

AVAILABLE = 30
CAP = 2
MODELS = [f"addk_{k}" for k in range(1, 6)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, synthetic_models):
    root = tmp_path_factory.mktemp("dataplane-repo")
    build_gate(root / "built")
    return link_repository(root / "models", [root / "built" / "gate", *synthetic_models(5)])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(repo, tmp_path_factory):
    settings = settings_mod.load(None, {}, {
        "model_repository": str(repo), "node.local_nodes": 1, "server.data_plane": "haproxy",
        "cache.max_models_per_node": CAP, "server.grpc_port": 0, "server.rest_port": 0,
        "server.bind_address": "127.0.0.1",
        "node.state_dir": str(tmp_path_factory.mktemp("dataplane-app") / "state"),
        "server.request_log": str(tmp_path_factory.mktemp("dataplane-log") / "requests.csv"),
        "node.template_socket": node_template()})
    async with serving(settings) as app:
        yield app


def predict(target: str, name: str, x: float = 1.0) -> float:
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return stub.Predict(predict_request(name, x), timeout=120).outputs["y"].float_val[0]


def routed(app, name: str) -> bool:
    return name in app.dataplane.routes.current


async def routed_count(app, name: str) -> int:
    return sum(use.requests for (model, _), use in (await app.dataplane.routes.usage()).items()
               if model == name)


async def evict_all(app) -> None:
    cache = app.backends["node0"].cache
    for model in {m.name for m in cache.snapshot()}:
        await cache.evict(model)


async def test_warm_requests_are_routed_by_haproxy_and_counted_by_the_cache(app):
    await evict_all(app)
    cache = app.backends["node0"].cache
    assert await asyncio.to_thread(predict, app.target, "addk_1") == 2.0  # cold: the slow path
    await until(lambda: routed(app, "addk_1"), 30, "addk_1 routed")
    before = await routed_count(app, "addk_1")
    for x in range(10):
        assert await asyncio.to_thread(predict, app.target, "addk_1", float(x)) == x + 1.0
    assert await routed_count(app, "addk_1") == before + 10  # all ten went through HAProxy
    # /metrics counts them too, at the control plane's next poll
    await until(lambda: app.metrics.counts["tfscache_dataplane_routed"].get("node0", 0)
                >= before + 10, 10, "the routed requests in /metrics")
    scrape = generate_latest(app.metrics.registry).decode()
    value = re.search(r'^tfscache_dataplane_routed_total\{node="node0"\} (\S+)$', scrape, re.M)
    assert value is not None and float(value.group(1)) >= before + 10
    # ... and the cache heard of them, as of a lease taken and given back
    used = lambda: [m.last_use for m in cache.snapshot() if m.name == "addk_1"]
    first = used()
    for x in range(3):
        await asyncio.to_thread(predict, app.target, "addk_1", float(x))
    await until(lambda: used() != first, 10, "addk_1's last use moved by routed requests")


def answered(app, protocol: str, method: str, code: str) -> float:
    """tfscache_requests_total for these labels, from a scrape of /metrics' registry."""
    scrape = generate_latest(app.metrics.registry).decode()
    value = re.search(rf'^tfscache_requests_total\{{code="{code}",method="{method}",'
                      rf'protocol="{protocol}"\}} (\S+)$', scrape, re.M)
    return float(value.group(1)) if value else 0.0


def logged(app, name: str) -> list[dict]:
    with open(app.settings.server.request_log, newline="") as file:
        return [row for row in csv.DictReader(file) if row["model"] == name]


async def test_routed_requests_are_in_the_request_metrics_and_the_request_log(app):
    await asyncio.to_thread(predict, app.target, "addk_2")
    await until(lambda: routed(app, "addk_2"), 30, "addk_2 routed")
    labels = [("grpc", "Predict", "OK"), ("grpc", "Predict", "INVALID_ARGUMENT"),
              ("rest", "Predict", "200")]
    before = [answered(app, *label) for label in labels]
    through_haproxy = await routed_count(app, "addk_2")
    await until(lambda: len(logged(app, "addk_2")) >= 1, 10, "the cold request's row")
    rows = len(logged(app, "addk_2"))
    for x in range(4):
        assert await asyncio.to_thread(predict, app.target, "addk_2", float(x)) == x + 2.0
    with grpc.insecure_channel(app.target) as channel:  # the node's own error, routed
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            await asyncio.to_thread(stub.Predict, predict_request(
                "addk_2", inputs={"no_such_input": float_tensor([1.0])}), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for x in range(2):
        reply = await asyncio.to_thread(requests.post, f"{app.rest}/v1/models/addk_2:predict",
                                        json={"instances": [float(x)]}, timeout=60)
        assert reply.status_code == 200, reply.text
    assert await routed_count(app, "addk_2") == through_haproxy + 7  # none took the slow path
    want = [before[0] + 4, before[1] + 1, before[2] + 2]
    await until(lambda: [answered(app, *label) for label in labels] == want, 10,
                "the routed requests counted by method and code")
    await until(lambda: len(logged(app, "addk_2")) == rows + 7, 10, "their request-log rows")
    new = logged(app, "addk_2")[rows:]
    assert sorted(row["code"] for row in new) == ["200"] * 2 + ["INVALID_ARGUMENT"] + ["OK"] * 4
    assert {(row["node"], row["version"], row["cold"]) for row in new} == {("node0", "1", "0")}
    scrape = generate_latest(app.metrics.registry).decode()  # and their latency, same labels
    count = re.search(r'^tfscache_request_duration_seconds_count\{code="200",method="Predict",'
                      r'protocol="rest"\} (\S+)$', scrape, re.M)
    assert count is not None and float(count.group(1)) == want[2]


def request_ids(app, name: str, given: str | None) -> tuple[str, str]:
    """The x-request-id a gRPC Predict's initial metadata and a REST :predict's header carry back,
    sent with ``given`` (or none)."""
    with grpc.insecure_channel(app.target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        _, call = stub.Predict.with_call(predict_request(name, 1.0), timeout=60,
                                         metadata=[("x-request-id", given)] if given else None)
        grpc_id = dict(call.initial_metadata()).get("x-request-id")
    reply = requests.post(f"{app.rest}/v1/models/{name}:predict", json={"instances": [1.0]},
                          headers={"X-Request-Id": given} if given else {}, timeout=60)
    assert reply.status_code == 200, reply.text
    return grpc_id, reply.headers.get("X-Request-Id")


async def test_a_routed_reply_carries_the_request_id(app):
    await asyncio.to_thread(predict, app.target, "addk_4")
    await until(lambda: routed(app, "addk_4"), 30, "addk_4 routed")
    before = await routed_count(app, "addk_4")
    assert await asyncio.to_thread(request_ids, app, "addk_4", "abc-123") == ("abc-123", "abc-123")
    made = await asyncio.to_thread(request_ids, app, "addk_4", None)
    assert all(made) and made[0] != made[1]  # one of its own for each request
    assert await routed_count(app, "addk_4") == before + 4  # all four went through HAProxy
    # the slow path (a pinned version) carries it too, the same one
    with grpc.insecure_channel(app.target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        _, call = await asyncio.to_thread(
            stub.Predict.with_call, predict_request("addk_4", 1.0, version=1), timeout=60,
            metadata=[("x-request-id", "slow-1")])
    assert dict(call.initial_metadata())["x-request-id"] == "slow-1"
    assert dict(call.trailing_metadata())["x-request-id"] == "slow-1"


async def test_a_model_loaded_long_before_its_next_request_is_routed(app):
    """The repository remembers a model's latest version for rescan_s; a resident model whose
    memory aged before the data plane routed it is listed again by the data plane itself, with
    no request for it needed."""
    cache = app.backends["node0"].cache
    await asyncio.to_thread(predict, app.target, "addk_5")
    await until(lambda: routed(app, "addk_5"), 30, "addk_5 routed")
    await app.dataplane.routes.withdraw("addk_5")
    listed_at, latest = cache.repository._latest["addk_5"]
    cache.repository._latest["addk_5"] = (listed_at - 3600.0, latest)  # listed an hour ago
    assert cache.resident_version("addk_5") is None
    await until(lambda: routed(app, "addk_5"), 30, "addk_5 routed again with no request")
    assert cache.resident_version("addk_5") == 1


async def test_routed_requests_keep_a_model_recent_for_the_policy(app):
    """LRU under a cap of 2: addk_2 is loaded after addk_1, then only addk_1 is used, through
    HAProxy. A third model must push out addk_2, which a cache blind to the data plane would
    keep."""
    await evict_all(app)
    cache = app.backends["node0"].cache
    await asyncio.to_thread(predict, app.target, "addk_1")
    await asyncio.to_thread(predict, app.target, "addk_2")
    await until(lambda: routed(app, "addk_1"), 30, "addk_1 routed")
    last = lambda name: max((m.last_use for m in cache.snapshot() if m.name == name), default=0)
    before = await routed_count(app, "addk_1")

    async def addk_1_more_recent() -> bool:  # one more routed request per try
        await asyncio.to_thread(predict, app.target, "addk_1")
        return last("addk_1") > last("addk_2")

    await until(addk_1_more_recent, 30, "addk_1 used after addk_2, through HAProxy")
    assert await routed_count(app, "addk_1") > before
    assert await asyncio.to_thread(predict, app.target, "addk_3") == 4.0
    assert {m.name for m in cache.snapshot() if m.state == "available"} == {"addk_1", "addk_3"}


async def test_an_eviction_waits_for_a_request_in_flight_on_the_data_plane(app):
    await evict_all(app)
    cache = app.backends["node0"].cache
    node = app.backends["node0"].upstream.grpc_address
    first = asyncio.ensure_future(asyncio.to_thread(predict_gate, app.target))  # cold: loads it
    await until(lambda: cache.is_resident("gate", 1), 60, "gate loaded")
    await asyncio.to_thread(release, node, 1.0)
    assert await first == 1.0
    await until(lambda: routed(app, "gate"), 30, "gate routed")
    held = asyncio.ensure_future(asyncio.to_thread(predict_gate, app.target))
    await until(lambda: app.dataplane.routes.in_flight("gate@node0"), 30, "held on HAProxy")
    assert all(m.leases == 0 for m in cache.snapshot() if m.name == "gate")  # not via Python
    evict = asyncio.ensure_future(cache.evict("gate", 1))
    await until(lambda: not routed(app, "gate"), 30, "the route taken away")
    assert cache.state_of("gate", 1) == "unloading"
    assert not evict.done() and not held.done()  # the unload waits for the request in flight
    states = [s.state for s in await asyncio.to_thread(version_status_at, node, "gate")]
    assert states == [AVAILABLE]  # ... and the node was not told to unload it
    await asyncio.to_thread(release, node, 42.0)
    assert await asyncio.wait_for(held, 60) == 42.0  # the held request succeeds
    assert await asyncio.wait_for(evict, 60) == [("gate", 1)]  # then the unload goes ahead


async def test_churn_over_more_models_than_fit_fails_no_request(app):
    await evict_all(app)
    node = app.backends["node0"].upstream.grpc_address
    failures, answers, lock = [], [], threading.Lock()

    def client(offset: int) -> None:
        for i in range(24):
            name = MODELS[(i + offset) % len(MODELS)]
            try:
                y = predict(app.target, name)
                with lock:
                    answers.append(y == 1.0 + int(name.split("_")[1]))
            except grpc.RpcError as e:
                with lock:
                    failures.append(f"{name}: {e.code()} {e.details()}")

    with StatusSampler(node, MODELS) as sampler:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            await asyncio.gather(*(asyncio.wrap_future(pool.submit(client, o)) for o in range(3)))
    assert failures == []
    assert len(answers) == 72 and all(answers)
    assert sampler.peak <= CAP
