"""The scaling signal through Metrics and /status: scripted cache events, a fake clock, fake caches."""

from __future__ import annotations

import pytest

from tfscache.cache.ledger import ResidentModel
from tfscache.frontend.backends import NodeBackend
from tfscache.observe.metrics import Metrics, NodeView
from tfscache.observe.server import status_document
from tfscache.settings import ScaleSection

from .promtext import Scrape
from .test_metrics import scrape
from support.fakecache import FakeCache

from .test_status_document import FakeUpstream, topology


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def resident(n: int, state: str = "available") -> list[ResidentModel]:
    return [ResidentModel(f"m{i}", 1, 100, True, 0, 0.0, state) for i in range(n)]


def metrics_with(clock: Clock, caches: dict[str, FakeCache], **scale) -> Metrics:
    metrics = Metrics(scale=ScaleSection(window_s=60.0, **scale), clock=clock)
    metrics.watch(lambda: [NodeView(name, cache, True) for name, cache in caches.items()], lambda: len(caches))
    return metrics


def test_capacity_unloads_per_minute_and_the_advice_to_add_nodes():
    clock = Clock()
    caches = {"node0": FakeCache(resident(3), max_models=3), "node1": FakeCache(resident(3), max_models=3)}
    metrics = metrics_with(clock, caches, unloads_per_minute_high=10.0)
    events = metrics.cache_events("node0")
    for i in range(15):
        events.evicted((f"m{i}", 1), "capacity", 100)
    for reason in ("admin", "drain", "vanished", "node_lost"):  # not the cost of too few nodes
        events.evicted(("x", 1), reason, 100)
    s = scrape(metrics)
    assert s.value("tfscache_unloads_per_minute", node="node0") == 15.0
    assert s.value("tfscache_unloads_per_minute", node="node1") == 0.0
    assert s.value("tfscache_scale_advice") == 0  # the mean, 7.5 per minute, is under 10
    for i in range(5):
        metrics.cache_events("node1").evicted((f"m{i}", 1), "capacity", 100)
    assert scrape(metrics).value("tfscache_scale_advice") == 1  # (15 + 5) / 2 = 10
    clock.now += 60.0  # the window has passed
    s = scrape(metrics)
    assert s.value("tfscache_unloads_per_minute", node="node0") == 0.0
    assert s.value("tfscache_scale_advice") == 0  # quiet, but 6 models need both nodes


def test_the_advice_to_remove_a_node_when_the_resident_set_fits_on_fewer():
    clock = Clock()
    # 3 nodes capped at 4 models: two hold 8 x 0.75 = 6; unloading versions do not count
    caches = {f"node{i}": FakeCache(resident(2) + resident(3, "unloading"), max_models=4) for i in range(3)}
    metrics = metrics_with(clock, caches, headroom=0.25)
    assert scrape(metrics).value("tfscache_scale_advice") == -1
    caches["node0"].models += resident(1, "loading")
    assert scrape(metrics).value("tfscache_scale_advice") == 0


def test_status_document_and_scrape_agree():
    clock = Clock()
    cache = FakeCache(resident(2), max_models=2)
    metrics = Metrics(scale=ScaleSection(window_s=120.0), clock=clock)
    for _ in range(4):
        metrics.cache_events("node0").evicted(("a", 1), "capacity", 100)
    doc = status_document(metrics, topology([NodeBackend("node0", FakeUpstream("127.0.0.1:1"), cache)]))
    assert doc["scale"] == {"advice": 0, "reason": "2.0 unloads per minute per node > 1",
                            "window_s": 120.0, "unloads_per_minute": {"node0": pytest.approx(2.0)}}
    assert doc["nodes"][0]["unloads_per_minute"] == pytest.approx(2.0)
