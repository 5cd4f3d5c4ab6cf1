"""The simulator and the live cache share one planner: one trace, the same loads and evictions.

The trace is replayed through ``tfscache simulate``'s engine and, request by request, through
a CacheManager on a real ``tfscache node``. Each policy whose order depends only on the order
of requests (not on measured load times or sizes) must give the same sequence in both. The
size-aware ``gdsf`` orders by what the live cache measured: the simulator replays the trace
with the load seconds and bytes the live cache recorded for each of its loads, and must
then choose the same victims.
"""

from __future__ import annotations

import random

import pytest

from support.cache import RecordingClient
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.cache.events import CacheEvents
from tfscache.cache.manager import CacheManager
from tfscache.settings import CacheSection
from tfscache.cache.policy import make_policy
from tfscache.cache.policy.gdsf import GDSFPolicy
from tfscache.sim.engine import replay

MODELS = [f"addk_{k}" for k in range(1, 9)]


def trace(seed: int = 7, length: int = 60) -> list[int]:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(MODELS))]  # Zipf-like: churn, with some models hot
    return rng.choices(range(len(MODELS)), weights, k=length)


class Recording(CacheEvents):
    def __init__(self) -> None:
        self.sequence: list[tuple[str, str]] = []

    def loaded(self, key, seconds, size, measured) -> None:
        self.sequence.append(("load", key[0]))

    def evicted(self, key, reason, size) -> None:
        self.sequence.append(("evict", key[0]))


def simulated(policy: str, requests: list[int], cap: int) -> list[tuple[str, str]]:
    sequence: list[tuple[str, str]] = []
    rows = [(k, float(t), 1000, 0.01, 0) for t, k in enumerate(requests)]
    replay(rows, make_policy(policy), cap, 0, record=lambda what, key: sequence.append((what, MODELS[key])))
    return sequence


@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu"])
async def test_the_simulator_and_the_cache_load_and_evict_alike(policy, node, repository):
    requests = trace()
    events = Recording()
    client = RecordingClient(node.grpc_target, rpc_deadline_s=10.0)
    cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(node.pid)), repository,
                         CacheSection(max_models_per_node=3, policy=policy, reload_deadline_s=60.0), events=events)
    await cache.start()
    await cache.wait_synced(60)
    try:
        for k in requests:
            async with await cache.acquire(MODELS[k]):
                pass
    finally:
        await cache.stop()
        await client.close()
    expected = simulated(policy, requests, 3)
    assert sum(what == "evict" for what, _ in expected) >= 10  # the trace churns
    assert events.sequence == expected


class MeasuredGDSF(GDSFPolicy):
    """gdsf, keeping what each load told it: (key, bytes, seconds)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.loads: list[tuple[object, int, float]] = []

    def record_load(self, key, size_bytes, load_seconds, now) -> None:
        self.loads.append((key, size_bytes, load_seconds))
        super().record_load(key, size_bytes, load_seconds, now)


async def test_gdsf_evicts_alike_live_and_replayed_with_the_live_measurements(node, repository):
    requests = trace(seed=11, length=60)
    events = Recording()
    live_policy = MeasuredGDSF(halflife=20)  # a short half-life: decay matters within 60 requests
    client = RecordingClient(node.grpc_target, rpc_deadline_s=10.0)
    cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(node.pid)), repository,
                         CacheSection(max_models_per_node=3, policy="gdsf", reload_deadline_s=60.0),
                         policy=live_policy, events=events)
    await cache.start()
    await cache.wait_synced(60)
    measured: list[tuple[int, float]] = []  # per request: what its load measured ((0, 0.0): a hit)
    try:
        for k in requests:
            before = len(live_policy.loads)
            async with await cache.acquire(MODELS[k]):
                pass
            if len(live_policy.loads) > before:
                [(key, size, seconds)] = live_policy.loads[before:]
                assert key[0] == MODELS[k]
                measured.append((size, seconds))
            else:
                measured.append((0, 0.0))
    finally:
        await cache.stop()
        await client.close()
    assert len({seconds for _, seconds in measured if seconds}) > 1  # measured, so not all alike
    rows = [(k, float(t), size, seconds, 0) for t, (k, (size, seconds)) in enumerate(zip(requests, measured))]
    expected: list[tuple[str, str]] = []
    replayed = GDSFPolicy(halflife=20)
    replayed.set_caps(3, 0)
    replay(rows, replayed, 3, 0, record=lambda what, key: expected.append((what, MODELS[key])))
    assert sum(what == "evict" for what, _ in expected) >= 10  # the trace churns
    assert expected != simulated("lru", requests, 3)  # the measurements and counts decide, not recency alone
    assert events.sequence == expected
