"""Model statistics in sidecar mode, gathered across the cache: two sidecars (in-process
ServeApp), each in front of its own real tritonserver, peers of each other.

A model held by both nodes: statistics asked of either sidecar (gRPC ModelStatistics with
tritonclient, REST ``.../stats`` with plain HTTP) are the sum of both nodes' own answers. A
peer asked for a model its node does not hold says so and does not load it. A peer that
cannot be reached is left out of the answer and named in a warning; the request succeeds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
from support.process import started_together
from support.sidecars import running_sidecars
from support.triton import resident_models, start_triton
from support.waiting import wait_until

from tfscache.cluster.ring import Ring
from tfscache.discovery import Peer
from tfscache.frontend.backends import FORWARDED_KEY

MODEL = "addk_1"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, triton_repository):
    """The two tritonservers, started at once."""
    with started_together([functools.partial(start_triton, tmp_path_factory.mktemp(name), triton_repository)
                           for name in ("triton", "triton_b")]) as pair:
        yield pair


@pytest.fixture(scope="module")
def triton(nodes):
    """The first node (conftest's ``triton``, started beside the second)."""
    return nodes[0]


@pytest.fixture(scope="module")
def triton_b(nodes):
    """The second node."""
    return nodes[1]


@pytest.fixture
async def sidecars(triton, triton_b, triton_repository, tmp_path):
    async with running_sidecars({"a": triton, "b": triton_b}, triton_repository, tmp_path,
                                {"node.backend": "triton"}) as apps:
        yield apps


def infer(target: str, name: str, x: float, headers=None) -> list[float]:
    client = tritongrpc.InferenceServerClient(target)
    try:
        tensor = tritongrpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
        return client.infer(name, [tensor], headers=headers, client_timeout=60).as_numpy("y").tolist()
    finally:
        client.close()


def grpc_stats(target: str, name: str) -> dict:
    """ModelStatistics of ``name`` (tritonclient's JSON form) as one entry."""
    client = tritongrpc.InferenceServerClient(target)
    try:
        answer = client.get_inference_statistics(name, as_json=True, client_timeout=30)
    finally:
        client.close()
    (stats,) = answer["model_stats"]
    return stats


def totals(stats: dict) -> tuple[int, int, int, int]:
    success = stats["inference_stats"]["success"]
    return (int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0)), int(success.get("count", 0)),
            int(success.get("ns", 0)))


async def rest_stats(port: int, name: str) -> dict:
    # In-process sidecars: the client must not block the loop.
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/v2/models/{name}/stats") as reply:
        assert reply.status == 200, await reply.text()
        (stats,) = (await reply.json())["model_stats"]
        return stats


def _totals_once(target: str, count: int) -> tuple | None:
    """The node's own totals for MODEL once it counts ``count`` inferences, else None."""
    got = totals(grpc_stats(target, MODEL))
    return got if got[:3] == (count, count, count) else None


def sum_of(*answers: tuple) -> tuple:
    return tuple(map(sum, zip(*answers)))


async def test_statistics_through_either_sidecar_cover_every_node_that_holds_the_model(
        sidecars, triton, triton_b, caplog):
    a, b = sidecars["a"], sidecars["b"]
    # Marked as forwarded, each sidecar serves the model from its own node: both nodes hold it.
    for app, count in ((a, 2), (b, 3)):
        for i in range(count):
            y = await asyncio.to_thread(infer, f"127.0.0.1:{app.grpc_port}", MODEL, float(i),
                                        {FORWARDED_KEY: "test"})
            assert y == [i + 1.0]
    # Triton counts a request once its response is released: wait for each node's own count.
    node_a, node_b = [
        await asyncio.to_thread(wait_until, functools.partial(_totals_once, node.grpc_target, count), 60,
                                f"node {node.grpc_target} to count {count} inferences")
        for node, count in ((triton, 2), (triton_b, 3))]
    assert node_a[:3] == (2, 2, 2) and node_b[:3] == (3, 3, 3)
    expected = sum_of(node_a, node_b)

    for app in (a, b):
        assert totals(await asyncio.to_thread(grpc_stats, f"127.0.0.1:{app.grpc_port}", MODEL)) == expected
        assert totals(await rest_stats(app.rest_port, MODEL)) == expected

    # A model no node holds, asked of its owner's sidecar: the peer, asked only for what its
    # node holds, does not load it; the request loads it once, on the owner's node, as before
    # (Triton's zeros).
    other = "addk_3"
    owner = Ring(["a", "b"]).owner(other)
    nodes = {"a": triton, "b": triton_b}
    stats = await asyncio.to_thread(grpc_stats, f"127.0.0.1:{sidecars[owner].grpc_port}", other)
    assert totals(stats)[:3] == (0, 0, 0)
    holders = [name for name, node in nodes.items()
               if other in await asyncio.to_thread(resident_models, node.grpc_target)]
    assert holders == [owner]

    # A peer that cannot be reached is left out and named; the request succeeds.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"  # closed when the block ends: nothing listens
    await a.set_peers([Peer("a", f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{a.rest_port}"),
                       Peer("b", f"127.0.0.1:{b.grpc_port}", f"127.0.0.1:{b.rest_port}"),
                       Peer("c", dead, dead)])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfscache.frontend.protocols.oip.stats"):
        assert totals(await asyncio.to_thread(grpc_stats, f"127.0.0.1:{a.grpc_port}", MODEL)) == expected
        assert totals(await rest_stats(a.rest_port, MODEL)) == expected
    left_out = [r.getMessage() for r in caplog.records if "peer c left out" in r.getMessage()]
    assert len(left_out) == 2, [r.getMessage() for r in caplog.records]

