"""The CacheManager's events, from a real ``tfscache node``: what a Metrics object counts.

Each test drives a real CacheManager (over a real node, with a load gate that can make
loads fail) whose observer both records the events and counts them into a Metrics;
a scrape of the registry must agree with the recorded stream.
"""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from prometheus_client import generate_latest

from support import fixtures
from support.waiting import until
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache import errors
from tfscache.cache.manager import CacheManager
from tfscache.settings import CacheSection
from tfscache.observe.metrics import Metrics, NodeEvents, NodeView
from tfscache.kinds.tfserving.client import NodeClient
from tfscache.repository.local import ModelRepository

from .promtext import Scrape


class Recording(NodeEvents):
    """NodeEvents that also keep the stream: (event, model, extra) tuples."""

    def __init__(self, metrics: Metrics, node: str) -> None:
        super().__init__(metrics, node)
        self.stream: list[tuple] = []

    def hit(self, key):
        self.stream.append(("hit", key[0]))
        super().hit(key)

    def miss(self, key):
        self.stream.append(("miss", key[0]))
        super().miss(key)

    def loaded(self, key, seconds, size, measured):
        self.stream.append(("loaded", key[0], measured))
        assert seconds > 0 and size > 0
        super().loaded(key, seconds, size, measured)

    def load_failed(self, key, seconds, error):
        self.stream.append(("load_failed", key[0], type(error).__name__))
        super().load_failed(key, seconds, error)

    def room_waited(self, key, seconds):
        self.stream.append(("room_waited", key[0]))
        self.room_seconds = seconds
        super().room_waited(key, seconds)

    def evicted(self, key, reason, size):
        self.stream.append(("evicted", key[0], reason))
        super().evicted(key, reason, size)

    def unloaded(self, key, seconds, size):
        self.stream.append(("unloaded", key[0]))
        super().unloaded(key, seconds, size)

    def take(self) -> list[tuple]:
        stream, self.stream = self.stream, []
        return stream


gate_dir = fixtures.gate_dir
node = fixtures.gated_node


@pytest.fixture
def repo_root(synthetic_models, tmp_path):
    root = tmp_path / "models"
    for base in synthetic_models([1, 2, 3]):
        shutil.copytree(base, root / base.name)
    return root


@pytest.fixture
async def cache_of(node, repo_root, gate_dir):
    made = []

    async def make(**settings):
        metrics = Metrics()
        events = Recording(metrics, "n0")
        client = NodeClient(node.grpc_target, rpc_deadline_s=10.0)
        repository = ModelRepository(repo_root, rescan_s=0.0)
        cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(node.pid)), repository,
                             CacheSection(reload_deadline_s=60.0, **settings), events=events)
        metrics.watch(lambda: [NodeView("n0", cache, cache.healthy)], lambda: 1)
        made.append((cache, client))
        await cache.start()
        await cache.wait_synced(60)
        return cache, events, metrics

    yield make
    for cache, client in made:
        await cache.stop()
        await client.close()
    for path in gate_dir.iterdir():
        path.unlink()


def scrape(metrics: Metrics) -> Scrape:
    return Scrape(generate_latest(metrics.registry).decode())


async def test_miss_load_hit_then_room_wait_eviction_and_unload(cache_of):
    cache, events, metrics = await cache_of(max_models_per_node=1)
    (await cache.acquire("addk_1")).release()
    (await cache.acquire("addk_1")).release()
    assert events.take() == [("miss", "addk_1"), ("loaded", "addk_1", True), ("hit", "addk_1")]
    held = await cache.acquire("addk_1")
    waiting = asyncio.create_task(cache.acquire("addk_2"))
    await until(lambda: any(q.waiting_for_room for q in cache.queue()), 30,
                "a load waiting for room", interval=0.01)
    s = scrape(metrics)
    assert s.value("tfscache_leases_in_flight", node="n0") == 1
    assert s.value("tfscache_load_queue_depth", node="n0") == 1
    assert s.value("tfscache_resident_models", node="n0") == 1
    assert s.value("tfscache_room_wait_seconds_count") == 0
    blocked_at = time.monotonic()
    held.release()
    (await waiting).release()
    assert events.take() == [("hit", "addk_1"), ("miss", "addk_2"), ("room_waited", "addk_2"),
                             ("evicted", "addk_1", "capacity"), ("unloaded", "addk_1"),
                             ("loaded", "addk_2", True)]
    assert 0 < events.room_seconds < time.monotonic() - blocked_at + 30
    s = scrape(metrics)
    assert s.value("tfscache_cache_hits_total") == 2 and s.value("tfscache_cache_misses_total") == 2
    assert s.value("tfscache_loads_total") == 2 and s.value("tfscache_load_duration_seconds_count") == 2
    assert s.value("tfscache_room_wait_seconds_count", node="n0") == 1
    assert s.value("tfscache_evictions_total", node="n0", reason="capacity") == 1
    assert s.value("tfscache_unloads_total", node="n0") == 1
    assert s.value("tfscache_resident_models", node="n0") == 1
    assert s.value("tfscache_leases_in_flight", node="n0") == 0
    assert s.value("tfscache_node_healthy", node="n0") == 1


async def test_a_failed_load_is_a_miss_and_a_load_failure(cache_of, gate_dir):
    cache, events, metrics = await cache_of(failure_backoff_s=0)
    (gate_dir / "addk_3.fail").touch()
    with pytest.raises(errors.Internal):
        await cache.acquire("addk_3")
    assert events.take() == [("miss", "addk_3"), ("load_failed", "addk_3", "Internal")]
    s = scrape(metrics)
    assert s.value("tfscache_load_failures_total", node="n0") == 1 and s.value("tfscache_loads_total") == 1
    assert s.value("tfscache_load_duration_seconds_count") == 0
    assert s.value("tfscache_resident_models", node="n0") == 0


async def test_a_model_gone_from_the_repository_is_evicted_as_vanished(cache_of, repo_root):
    cache, events, metrics = await cache_of()
    (await cache.acquire("addk_1")).release()
    shutil.rmtree(repo_root / "addk_1")
    (await cache.acquire("addk_2")).release()  # the reloader's next step drops addk_1
    await until(lambda: not cache.is_resident("addk_1") and len(cache.snapshot()) == 1, 30,
                "addk_1 to be evicted", interval=0.01)
    assert ("evicted", "addk_1", "vanished") in events.take()
    assert scrape(metrics).value("tfscache_evictions_total", reason="vanished") == 1
