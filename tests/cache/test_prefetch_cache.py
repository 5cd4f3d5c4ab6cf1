"""Co-access prefetch in the cache manager, against a fake node adapter whose loads are held on events.

The fake is faithful to the adapter contract (tfscache/cache/adapter.py): ``load`` returns once each
key is AVAILABLE or failed, ``unload`` once each is gone. A load of a model named in ``held`` waits
for its event; one named in ``failing`` fails with the node's error. Every load's keys go on
``started`` as the load begins, so a test waits for a load (or asserts none came) without sleeping.
"""

from __future__ import annotations

import asyncio

import pytest

from support.waiting import until
from tfscache import errors
from tfscache.cache.ledger import LOADING, READY
from tfscache.cache.manager import CacheManager
from tfscache.repository.local import ModelRepository
from tfscache.settings import CacheSection

NOTHING_S = 0.3  # how long "no prefetch started" is watched for: a prefetch starts within milliseconds


class FakeAdapter:
    """A node in memory (see the module docstring)."""

    target = "fake0"
    client = None
    lost_texts = ("Servable not found",)
    sizes_on_disk = True
    loads_apart = True  # a load call per key may run beside another (cache.adapter)

    def __init__(self) -> None:
        self.serving: set = set()
        self.held: dict[str, asyncio.Event] = {}
        self.failing: set[str] = set()
        self.started: asyncio.Queue = asyncio.Queue()
        self.loads: list = []
        self.calls: list = []  # each load call's keys
        self.closed = 0  # close() calls

    def hold(self, name: str) -> asyncio.Event:
        self.held[name] = asyncio.Event()
        return self.held[name]

    async def wait_ready(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        self.closed += 1

    async def sync(self, wanted, deadline_s: float) -> None:
        self.serving = set(wanted)

    async def load(self, keys, wanted, deadline_s: float):
        self.loads += list(keys)
        self.calls.append(list(keys))
        for key in keys:
            self.started.put_nowait(key)
        for key in keys:
            if key[0] in self.held:
                await self.held[key[0]].wait()
        self.serving = set(wanted) - {k for k in keys if k[0] in self.failing}
        return {k: errors.Internal(f"Loading servable: {k} failed") if k[0] in self.failing else None for k in keys}

    async def unload(self, keys, wanted, deadline_s: float) -> None:
        self.serving = set(wanted)

    async def available(self, key, deadline_s: float) -> bool:
        return key in self.serving

    def memory(self) -> int | None:
        return None

    def restarted(self) -> bool:
        return False

    def loads_of(self, name: str) -> int:
        return sum(1 for key in self.loads if key[0] == name)


@pytest.fixture
def repository(tmp_path) -> ModelRepository:
    for name in ("a", "b", "c", "d"):
        version = tmp_path / name / "1"
        version.mkdir(parents=True)
        (version / "saved_model.pb").write_bytes(b"x" * 1000)
    return ModelRepository(tmp_path, rescan_s=0.0)


@pytest.fixture
async def made(repository):
    """Factory: ``await make(max_models=..., policy=...)`` -> (a started prefetching CacheManager, its fake)."""
    caches = []

    async def make(**settings):
        settings = {"prefetch": True, "prefetch_window_s": 5.0, "prefetch_min_support": 1.5,
                    "room_timeout_s": 5.0, "failure_backoff_s": 60.0, "policy": "lru", **settings}
        adapter = FakeAdapter()
        cache = CacheManager(adapter, repository, CacheSection(**settings))
        caches.append(cache)
        await cache.start()
        assert await cache.wait_ready(10)
        return cache, adapter

    yield make
    for cache in caches:
        await cache.stop()


async def test_a_stopped_cache_closes_its_adapter(repository):
    # OipAdapter's watches of loads past their deadline end with the cache (a node that exited).
    adapter = FakeAdapter()
    cache = CacheManager(adapter, repository, CacheSection())
    await cache.start()
    assert adapter.closed == 0
    await cache.stop()
    assert adapter.closed == 1


async def use(cache: CacheManager, name: str) -> None:
    lease = await cache.acquire(name, 1, timeout=10)
    lease.release()


async def teach(cache: CacheManager, times: int = 2) -> None:
    """a then b, ``times`` times: b becomes a's follower (min_support 1.5)."""
    for _ in range(times):
        await use(cache, "a")
        await use(cache, "b")


async def drain_started(adapter: FakeAdapter) -> None:
    while not adapter.started.empty():
        adapter.started.get_nowait()


async def cold(cache: CacheManager, name: str) -> None:
    await cache.evict(name, 1)
    assert cache.state_of(name, 1) is None


async def next_load(adapter: FakeAdapter):
    return await asyncio.wait_for(adapter.started.get(), 5.0)


async def no_load(adapter: FakeAdapter) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(adapter.started.get(), NOTHING_S)


async def test_prefetch_loads_the_follower_after_a_when_there_is_room(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    await drain_started(adapter)
    await use(cache, "a")  # a hit: b is its likely follower, cold, and there is room
    assert await next_load(adapter) == ("b", 1)
    await until(lambda: cache.state_of("b", 1) == READY, 5.0, "b ready", interval=0.005)
    assert cache.prefetch_counts.as_dict() == {"started": 1, "completed": 1, "failed": 0, "used": 0, "wasted": 0}
    loads = adapter.loads_of("b")
    await use(cache, "b")  # a hit on the prefetched model
    assert adapter.loads_of("b") == loads
    assert cache.prefetch_counts.as_dict()["used"] == 1


async def test_off_by_default_nothing_is_prefetched(made):
    cache, adapter = await made(prefetch=False, max_models_per_node=3)
    await teach(cache, 3)
    await cold(cache, "b")
    await drain_started(adapter)
    await use(cache, "a")
    await no_load(adapter)
    assert cache.prefetch_counts is None


async def test_no_room_no_prefetch_and_no_victim_in_flight_or_pinned(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    busy = await cache.acquire("c", 1, timeout=10)  # c has a request in flight
    await cache.pin("d", 1)
    await drain_started(adapter)
    a = await cache.acquire("a", 1, timeout=10)  # the cap is full: a, c (leased), d (pinned)
    await no_load(adapter)
    assert cache.state_of("b", 1) is None
    assert {k[0] for k in cache.wanted()} == {"a", "c", "d"}
    a.release()
    busy.release()
    assert cache.prefetch_counts.as_dict()["started"] == 0


async def test_lru_prefetch_takes_only_an_idle_victim(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    await use(cache, "d")  # idle, least recently used once a and c are used
    busy = await cache.acquire("c", 1, timeout=10)
    await drain_started(adapter)
    await use(cache, "a")
    assert await next_load(adapter) == ("b", 1)
    await until(lambda: cache.state_of("b", 1) == READY, 5.0, "b ready", interval=0.005)
    assert cache.state_of("d", 1) is None and cache.state_of("c", 1) == READY  # the idle one went
    busy.release()


async def test_a_request_during_the_prefetch_joins_its_load(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    await drain_started(adapter)
    release = adapter.hold("b")
    loads = adapter.loads_of("b")
    await use(cache, "a")
    assert await next_load(adapter) == ("b", 1)
    assert cache.state_of("b", 1) == LOADING
    request = asyncio.create_task(cache.acquire("b", 1, timeout=10))
    await no_load(adapter)  # it waits for the prefetch in flight: no second load
    assert not request.done()
    release.set()
    (await request).release()
    assert adapter.loads_of("b") == loads + 1
    assert cache.prefetch_counts.as_dict() == {"started": 1, "completed": 1, "failed": 0, "used": 1, "wasted": 0}


async def test_a_failed_prefetch_does_not_poison_the_model(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    await drain_started(adapter)
    adapter.failing.add("b")
    await use(cache, "a")
    assert await next_load(adapter) == ("b", 1)
    await until(lambda: cache.prefetch_counts.as_dict()["failed"] == 1, 5.0, "a failed prefetch",
                interval=0.005)
    assert cache.failure("b", 1) is None  # no backoff: failure_backoff_s is 60 s, yet nothing is recorded
    adapter.failing.discard("b")
    await use(cache, "b")  # a real request loads it again
    assert cache.state_of("b", 1) == READY
    assert cache.prefetch_counts.as_dict()["used"] == 0


async def test_an_evicted_unused_prefetch_is_wasted(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "b")
    await drain_started(adapter)
    await use(cache, "a")
    assert await next_load(adapter) == ("b", 1)
    await until(lambda: cache.state_of("b", 1) == READY, 5.0, "b ready", interval=0.005)
    await cache.evict("b", 1)
    assert cache.prefetch_counts.as_dict() == {"started": 1, "completed": 1, "failed": 0, "used": 0, "wasted": 1}


async def test_a_drain_drops_a_prefetch_that_waits_for_room(made):
    cache, adapter = await made(max_models_per_node=2)
    await teach(cache)
    await cold(cache, "b")
    busy = await cache.acquire("c", 1, timeout=10)
    await drain_started(adapter)
    a = await cache.acquire("a", 1, timeout=10)  # b is queued as a prefetch: no room (a and c leased)
    await no_load(adapter)
    assert [q.name for q in cache.queue()] == []  # a prefetch alone is no cold request waiting
    drained = asyncio.create_task(cache.drain())
    a.release()
    busy.release()
    await asyncio.wait_for(drained, 5.0)  # the prefetch does not hold the drain open
    assert cache.wanted() == [] and cache.state_of("b", 1) is None
    assert cache.prefetch_counts.as_dict()["started"] == 0


async def test_a_cold_predecessor_loads_its_follower_beside_it_and_is_answered_first(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "a")
    await cold(cache, "b")
    await drain_started(adapter)
    release_a, release_b = adapter.hold("a"), adapter.hold("b")
    request = asyncio.create_task(cache.acquire("a", 1, timeout=10))
    # One reloader step: a's load and b's prefetch start together (a still loading), b's as a load of its own.
    assert {await next_load(adapter), await next_load(adapter)} == {("a", 1), ("b", 1)}
    assert not request.done() and [("a", 1)] in adapter.calls and [("b", 1)] in adapter.calls
    release_a.set()
    (await asyncio.wait_for(request, 5.0)).release()  # answered while b still loads
    assert cache.state_of("b", 1) == LOADING
    release_b.set()
    await until(lambda: cache.state_of("b", 1) == READY, 5.0, "b ready", interval=0.005)
    loads = adapter.loads_of("b")
    await use(cache, "b")  # the pipeline's next stage, sent once a answered: a hit
    assert adapter.loads_of("b") == loads
    assert cache.prefetch_counts.as_dict() == {"started": 1, "completed": 1, "failed": 0, "used": 1, "wasted": 0}


async def test_a_failed_prefetch_beside_a_real_load_fails_only_itself(made):
    cache, adapter = await made(max_models_per_node=3)
    await teach(cache)
    await cold(cache, "a")
    await cold(cache, "b")
    adapter.failing.add("b")
    await use(cache, "a")  # served: b's failure is b's alone
    await until(lambda: cache.prefetch_counts.as_dict()["failed"] == 1, 5.0, "a failed prefetch",
                interval=0.005)
    assert cache.healthy and cache.state_of("a", 1) == READY and cache.state_of("b", 1) is None
    adapter.failing.clear()
    await use(cache, "b")  # no failure backoff after a prefetch: it loads on request
    assert cache.state_of("b", 1) == READY


async def test_a_resident_follower_is_kept_as_warm_as_its_predecessor(made):
    cache, _ = await made(max_models_per_node=3)
    await teach(cache)
    await use(cache, "c")  # resident: a, b, c; b least recently used by its own requests
    await use(cache, "a")  # a hit: b, a's likely follower, is used with it
    await use(cache, "d")  # the cap takes the least recently used: c, not b
    assert cache.state_of("b", 1) == READY and cache.state_of("c", 1) is None


async def test_requests_served_elsewhere_teach_the_prefetch_in_their_order(made):
    # HAProxy's log of routed requests (tfscache.dataplane): a then b, twice, never through acquire
    cache, adapter = await made(max_models_per_node=3)
    await use(cache, "b")
    await use(cache, "a")  # both resident; through acquire, b was never a's follower
    for _ in range(2):
        cache.served_elsewhere("a", 1)
        cache.served_elsewhere("b", 1)
    await cold(cache, "b")
    await drain_started(adapter)
    cache.served_elsewhere("a", 1)  # a routed request for a: b is its likely follower, cold
    assert await next_load(adapter) == ("b", 1)
    cache.served_elsewhere("c", 1)  # not resident here: nothing learnt, nothing loaded
    await no_load(adapter)
