"""Requests held in flight on a worker (the ``gate`` model blocks until released), deterministically:

* revocation: an admin eviction of the version a worker serves under its delegation. The node is
  not told to unload it until the held request has finished, and that request succeeds;
* drain: the process stopping (what SIGTERM does: ``Lifecycle.shutdown``) lets the requests in
  flight on its workers finish, then every worker exits.

The control process runs in this test's process (``ServeApp``), so that the test can see what the
workers reported and evict through the cache as the admin API does; the node and the two workers are
real processes, and requests go through the workers' public port with the official client. The
eviction runs on the package's ``gate_app``; the drain stops its process, so it has one of its own.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from support.node import version_status_at
from support.requests import float_tensor, predict_request
from support.waiting import process_ended, until
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tfscache.app import ServeApp
from workers.conftest import serve_settings

HELD = ("node0", "gate", 1)
AVAILABLE = 30


def predict_gate(target: str) -> float:
    """A gate request over a channel of its own (a new connection: any worker may take it)."""
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        reply = stub.Predict(predict_request("gate", version=1, inputs={}), timeout=120)
        return reply.outputs["value"].float_val[0]


def release(target: str, value: float) -> None:
    """Release one held gate request, at the node itself (not through tfscache: its delegation is revoked)."""
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(predict_request("gate", version=1, signature="release",
                                     inputs={"value": float_tensor([value], shape=[])}), timeout=60)


@pytest.mark.asyncio(loop_scope="package")
async def test_an_eviction_waits_for_a_request_in_flight_on_a_worker(gate_app):
    app, target = gate_app, gate_app.target
    cache, pool = app.backends["node0"].cache, app.workers
    node = app.backends["node0"].upstream.grpc_address
    leases = lambda: sum(m.leases for m in cache.snapshot() if (m.name, m.version) == ("gate", 1))
    for attempt in range(1, 31):  # until a held request is a delegated one (the first is cold)
        held = asyncio.ensure_future(asyncio.to_thread(predict_gate, target))
        await until(lambda: pool.usage.in_flight(HELD) or leases(), 60, "the gate request in flight")
        if pool.usage.in_flight(HELD) == 1 and leases() == 0:
            break
        await asyncio.to_thread(release, node, float(attempt))  # a cold one: let it go, try again
        assert await held == float(attempt)
    else:
        raise AssertionError("no gate request was served under a delegation in 30 tries")
    evict = asyncio.ensure_future(cache.evict("gate", 1))
    done, _ = await asyncio.wait({evict}, timeout=0.5)
    assert not done  # the unload waits for the request in flight on the worker ...
    assert cache.state_of("gate", 1) == "unloading"
    states = [s.state for s in await asyncio.to_thread(version_status_at, node, "gate")]
    assert states == [AVAILABLE]  # ... and the node was not told to unload it
    assert not held.done()
    await asyncio.to_thread(release, node, 42.0)
    assert await asyncio.wait_for(held, 60) == 42.0  # the held request succeeds
    assert await asyncio.wait_for(evict, 60) == [("gate", 1)]  # then the unload goes ahead
    assert pool.grants.holders(HELD) == set()


def test_stopping_drains_the_requests_in_flight_on_the_workers(gate_repo, tmp_path):
    settings = serve_settings(gate_repo, tmp_path / "state")

    async def scenario() -> None:
        app = ServeApp(settings)
        grpc_port, _ = await app.start()
        target = f"127.0.0.1:{grpc_port}"
        stopping = None
        try:
            cache, pool = app.backends["node0"].cache, app.workers
            node = app.backends["node0"].upstream.grpc_address
            workers = [w.process.pid for w in pool.workers]
            leases = lambda: sum(m.leases for m in cache.snapshot() if (m.name, m.version) == ("gate", 1))
            held = [asyncio.ensure_future(asyncio.to_thread(predict_gate, target)) for _ in range(3)]
            # in flight: cold ones hold a lease here, warm ones are in the workers' reports
            await until(lambda: pool.usage.in_flight(HELD) + leases() == 3, 60, "three gate requests in flight")
            stopping = asyncio.ensure_future(app.lifecycle.shutdown(30.0))
            done, _ = await asyncio.wait({stopping}, timeout=0.5)
            assert not done and not any(h.done() for h in held)  # the workers wait for them
            for value in (1.0, 2.0, 3.0):
                await asyncio.to_thread(release, node, value)
            assert sorted(await asyncio.wait_for(asyncio.gather(*held), 60)) == [1.0, 2.0, 3.0]
            await asyncio.wait_for(stopping, 60)
            for pid in workers:
                assert process_ended(pid)
        finally:
            if stopping is None:
                await app.stop(0)

    asyncio.run(scenario())
