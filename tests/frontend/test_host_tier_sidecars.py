"""Host-tier sidecars (docs/tiers.md, "Host-tier sidecars"), against real `tfscache node`s.

Two in-process sidecars over the package's two real nodes: ``a`` (GPU tier, on the ring, in
front of node a) and ``h`` (``--node-tier host``: off the ring, in front of node b), each node
holding one model at most, ``cache.demote = host``. They know each other as discovery would
tell them, each peer with its tier. This machine has no GPU: node a's count cap stands in for
its GPU memory. What each node holds is read from the node itself (GetModelStatus); the client
is TF Serving's own stub.
"""

from __future__ import annotations

import contextlib

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from support.sidecars import node_holds, predict, sidecar_settings
from support.waiting import until
from tfscache.app import ServeApp
from tfscache.discovery import Peer

A, B = "addk_1", "addk_2"  # y = x + 1, x + 2


@contextlib.asynccontextmanager
async def gpu_and_host(nodes, repo, tmp_path, **more):
    common = {"cache.max_models_per_node": 1, "cache.demote": "host", **more}
    apps = {"a": ServeApp(sidecar_settings("a", nodes["a"], repo, tmp_path, common)),
            "h": ServeApp(sidecar_settings("h", nodes["b"], repo, tmp_path,
                                           {**common, "node.node_tier": "host"}))}
    try:
        for app in apps.values():
            await app.start()
        peers = [Peer(name, f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.rest_port}",
                      "host" if name == "h" else "gpu") for name, app in apps.items()]
        for app in apps.values():
            await app.set_peers(peers)
        yield apps
    finally:
        for app in apps.values():
            await app.stop(grace=1)


def counted(app, sample: str, **labels) -> float:
    text = generate_latest(app.metrics.registry).decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == sample and labels.items() <= s.labels.items())


async def answer(app, name: str, x: float = 1.0) -> list[float]:
    return list((await predict(app, name, x)).outputs["y"].float_val)


async def test_a_victim_goes_to_the_host_tier_sidecar_and_is_answered_there(nodes, frontend_repo,
                                                                           tmp_path):
    node_a, node_b = nodes["a"], nodes["b"]
    async with gpu_and_host(nodes, frontend_repo, tmp_path,
                            **{"cache.promote_horizon_s": 0.001}) as apps:
        a, h = apps["a"], apps["h"]
        assert a.topology.ring.nodes == ["a"] and h.topology.ring.nodes == ["a"]
        assert [b.name for b in a.topology.host_tier()] == ["h"]
        assert await answer(a, A) == [2.0]
        assert node_holds(node_a, A) and not node_holds(node_b, A)
        # B takes node a's one slot: A is loaded on node b (through h) before node a lets it go
        assert await answer(a, B) == [3.0]
        assert node_holds(node_b, A) and not node_holds(node_a, A) and node_holds(node_a, B)
        assert counted(a, "tfscache_tier_moves_total", node="a", to="host") == 1
        # A's requests: through a, forwarded to h (a handed it there); through h, answered there
        assert await answer(a, A) == [2.0]
        assert await answer(h, A, 5.0) == [6.0]
        assert not node_holds(node_a, A)  # no cold load on node a
        model = next(m for m in h.topology.node("h").cache.snapshot() if m.name == A)
        assert (model.tier, model.state) == ("host", "available")


async def test_a_host_tier_sidecar_hands_a_model_whose_promotion_pays_back(nodes, frontend_repo,
                                                                           tmp_path):
    node_a, node_b = nodes["a"], nodes["b"]
    async with gpu_and_host(nodes, frontend_repo, tmp_path,
                            **{"cache.promote_horizon_s": 1e9}) as apps:
        a, h = apps["a"], apps["h"]
        assert await answer(a, A) == [2.0]
        assert await answer(a, B) == [3.0]
        assert node_holds(node_b, A)
        # the first request h answers measures A's service there; the next pays its promotion
        assert await answer(a, A) == [2.0]
        assert await answer(a, A) == [2.0]
        await until(lambda: node_holds(node_a, A) and not node_holds(node_b, A), 60.0,
                    "A back on node a and gone from node b")
        # B, node a's victim, found no room on h (its slot was A's until A left): unloaded
        assert not node_holds(node_a, B) and not node_holds(node_b, B)
        assert counted(h, "tfscache_tier_moves_total", node="h", to="gpu") == 1
        assert await answer(a, A) == [2.0]
        assert await answer(h, A) == [2.0]  # h sends it to the ring: a


@pytest.mark.parametrize("overrides, problem", [
    ({"node.node_tier": "host"}, "needs cache.demote = host"),
    ({"node.node_tier": "host", "cache.demote": "host", "server.workers": 2}, "server.workers > 1"),
])
def test_settings_refuse_a_host_tier_sidecar_that_cannot_work(nodes, frontend_repo, tmp_path,
                                                              overrides, problem):
    from tfscache.settings import SettingsError

    with pytest.raises(SettingsError, match=problem):
        sidecar_settings("h", nodes["b"], frontend_repo, tmp_path, overrides)
