"""tfscache.observe.metrics alone: a fake stream of cache events and fake caches, read back by scraping."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

import tfscache
from support.fakecache import FakeCache, resident
from tfscache import errors
from tfscache.cache.events import CacheEvents
from tfscache.observe.metrics import STATES, Metrics, NodeEvents, NodeView

from .promtext import Scrape


def scrape(metrics: Metrics) -> Scrape:
    return Scrape(generate_latest(metrics.registry).decode())


def test_node_events_implement_every_cache_event():
    hooks = {n for n in vars(CacheEvents) if not n.startswith("_")}
    assert hooks == {"hit", "miss", "loaded", "load_failed", "room_waited", "evicted", "unloaded", "prefetch_used",
                     "moved", "move_failed"}
    assert hooks <= set(vars(NodeEvents))


def test_event_stream_moves_the_counters_and_histograms():
    metrics = Metrics()
    a, b = metrics.cache_events("node0"), metrics.cache_events("node1")
    a.miss(("m", 1))
    a.loaded(("m", 1), 0.3, 1000, True)
    a.hit(("m", 1))
    a.hit(("m", 1))
    b.miss(("bad", 1))
    b.load_failed(("bad", 1), 0.2, errors.Internal("boom"))
    b.room_waited(("x", 1), 1.5)
    a.evicted(("m", 1), "capacity", 1000)
    a.evicted(("n", 1), "vanished", 10)
    a.unloaded(("m", 1), 0.01, 1000)
    s = scrape(metrics)
    assert s.value("tfscache_cache_hits_total") == 2
    assert s.value("tfscache_cache_hits_total", node="node0") == 2
    assert s.value("tfscache_cache_misses_total") == 2
    assert s.value("tfscache_loads_total") == 2  # one loaded, one failed
    assert s.value("tfscache_load_failures_total", node="node1") == 1
    assert s.value("tfscache_load_failures_total", node="node0") == 0
    assert s.value("tfscache_load_duration_seconds_count") == 1  # successful loads only
    assert s.value("tfscache_load_duration_seconds_sum") == pytest.approx(0.3)
    assert s.value("tfscache_load_duration_seconds_bucket", le="0.25") == 0
    assert s.value("tfscache_load_duration_seconds_bucket", le="0.5") == 1
    assert s.value("tfscache_room_wait_seconds_count", node="node1") == 1
    assert s.value("tfscache_room_wait_seconds_sum") == pytest.approx(1.5)
    assert s.value("tfscache_evictions_total", reason="capacity") == 1
    assert s.value("tfscache_evictions_total", reason="vanished") == 1
    assert s.value("tfscache_unloads_total", node="node0") == 1
    assert metrics.hit_counts() == (2, 2)
    assert all("model" not in labels for labels in s.labelsets("tfscache_cache_hits_total"))


def test_per_model_labels_only_when_asked():
    metrics = Metrics(per_model=True)
    events = metrics.cache_events("node0")
    events.hit(("a", 1))
    events.miss(("b", 1))
    events.evicted(("a", 1), "capacity", 1)
    s = scrape(metrics)
    assert s.value("tfscache_cache_hits_total", node="node0", model="a") == 1
    assert s.value("tfscache_cache_misses_total", model="b") == 1
    assert s.value("tfscache_evictions_total", model="a", reason="capacity") == 1


@pytest.mark.parametrize("per_model", [False, True])
def test_requests_and_their_latency_are_counted_per_label_set(per_model):
    """The front ends' accounting binds each label set's children once; every set stays its own series."""
    from tfscache import logs

    metrics = Metrics(per_model=per_model)
    events = metrics.cache_events("node0")
    for model, code in (("a", "OK"), ("a", "OK"), ("b", "OK"), ("a", "NOT_FOUND")):
        logs.bind(model=model)
        started = metrics.begin()
        events.hit((model, 1))
        metrics.request("grpc", "Predict", code, started)
    metrics.request("rest", "predict", "200")  # counted, not timed
    logs.bind(model=None)
    s = scrape(metrics)
    assert s.value("tfscache_requests_total", protocol="grpc", code="OK") == 3
    assert s.value("tfscache_requests_total", protocol="grpc", code="NOT_FOUND") == 1
    assert s.value("tfscache_requests_total", protocol="rest", method="predict", code="200") == 1
    assert s.value("tfscache_request_duration_seconds_count", protocol="grpc", code="OK") == 3
    assert s.value("tfscache_request_duration_seconds_count", protocol="rest") == 0
    assert s.value("tfscache_cache_hits_total") == 4
    if per_model:
        assert s.value("tfscache_request_duration_seconds_count", code="OK", model="a") == 2
        assert s.value("tfscache_request_duration_seconds_count", code="OK", model="b") == 1
        assert s.value("tfscache_cache_hits_total", model="a") == 3
    else:
        assert all("model" not in labels for labels in s.labelsets("tfscache_request_duration_seconds_count"))


def test_gauges_read_the_caches_and_ring_at_scrape_time():
    metrics = Metrics()
    cache = FakeCache([resident("a", 1, 1000, leases=2), resident("b", 1, 300, measured=False)],
                      queued=3)
    views = [NodeView("node0", cache, True), NodeView("node1", None, False)]
    ring = ["node0", "node1"]
    metrics.watch(lambda: views, lambda: len(ring))
    s = scrape(metrics)
    assert s.value("tfscache_resident_models", node="node0") == 2
    assert s.value("tfscache_resident_bytes", node="node0", kind="measured") == 1000
    assert s.value("tfscache_resident_bytes", node="node0", kind="estimated") == 300
    assert s.value("tfscache_leases_in_flight", node="node0") == 2
    assert s.value("tfscache_load_queue_depth", node="node0") == 3
    assert s.value("tfscache_node_healthy", node="node0") == 1
    assert s.value("tfscache_node_healthy", node="node1") == 0
    assert s.value("tfscache_resident_models", node="node1") == 0
    assert s.value("tfscache_ring_nodes") == 2
    cache.models.pop()  # gauges follow the cache, not a copy
    ring.append("node2")
    s = scrape(metrics)
    assert s.value("tfscache_resident_models", node="node0") == 1
    assert s.value("tfscache_resident_bytes", node="node0", kind="estimated") == 0
    assert s.value("tfscache_ring_nodes") == 3


def test_resident_models_by_state_with_every_state_always_present():
    """A node capped at 3 swapping models: the states apart show the cap held."""
    metrics = Metrics()
    cache = FakeCache([resident("a", 1, 100, leases=1), resident("b", 1, 200),
                       resident("c", 1, 400, measured=False, state="loading"),
                       resident("d", 1, 800, state="unloading"),
                       resident("e", 1, 1600, state="unloading")],
                      max_models=3, memory_bytes=5000)
    metrics.watch(lambda: [NodeView("node0", cache, True), NodeView("node1", FakeCache([]), True),
                           NodeView("node2", None, False)], lambda: 3)
    s = scrape(metrics)
    assert [(labels["state"], s.value("tfscache_resident_models", **labels))
            for labels in s.labelsets("tfscache_resident_models") if labels["node"] == "node0"] == [
        ("loading", 1), ("available", 2), ("unloading", 2)]
    assert s.value("tfscache_resident_models", node="node0") == 5  # the old, unlabelled total
    in_cap = sum(s.value("tfscache_resident_models", node="node0", state=st) for st in ("loading", "available"))
    assert in_cap == s.value("tfscache_used_models", node="node0") <= s.value("tfscache_cap_models", node="node0") == 3
    assert s.value("tfscache_used_bytes", node="node0") == 700
    assert s.value("tfscache_cap_bytes", node="node0") == 5000
    assert s.value("tfscache_resident_bytes", node="node0", state="available", kind="measured") == 300
    assert s.value("tfscache_resident_bytes", node="node0", state="loading", kind="estimated") == 400
    assert s.value("tfscache_resident_bytes", node="node0", state="unloading") == 2400
    for node in ("node1", "node2"):  # no models, or down: still all three series, at 0
        labelsets = [ls for ls in s.labelsets("tfscache_resident_models") if ls["node"] == node]
        assert sorted(ls["state"] for ls in labelsets) == sorted(STATES)
        assert s.value("tfscache_resident_models", node=node) == 0
        assert len([ls for ls in s.labelsets("tfscache_resident_bytes") if ls["node"] == node]) == 6
    assert s.value("tfscache_cap_models", node="node1") == 0  # no cap
    assert {ls["node"] for ls in s.labelsets("tfscache_cap_models")} == {"node0", "node1"}  # node2: unknown


def test_tiers_and_gpu_bytes_per_node():
    """Available versions on each tier (a loading or leaving one is on none yet), and the GPU bytes
    the cache counts against its GPU cap; every tier present at 0 on an empty node."""
    metrics = Metrics()
    cache = FakeCache([resident("a", 1, 100), resident("b", 1, 200, tier="host"),
                       resident("c", 1, 400, tier="host"),
                       resident("d", 1, 800, state="loading"), resident("e", 1, 1600, state="unloading")])
    cache.gpu_reading = (3 << 30, 8 << 30)
    metrics.watch(lambda: [NodeView("node0", cache, True), NodeView("node1", FakeCache([]), True),
                           NodeView("node2", None, False)], lambda: 3)
    s = scrape(metrics)
    assert s.value("tfscache_tier_models", node="node0", tier="gpu") == 1
    assert s.value("tfscache_tier_models", node="node0", tier="host") == 2
    assert s.value("tfscache_tier_bytes", node="node0", tier="gpu") == 100
    assert s.value("tfscache_tier_bytes", node="node0", tier="host") == 600
    assert s.value("tfscache_gpu_used_bytes", node="node0") == 3 << 30
    assert s.value("tfscache_cap_gpu_bytes", node="node0") == 8 << 30
    assert sorted(ls["tier"] for ls in s.labelsets("tfscache_tier_models") if ls["node"] == "node1") == [
        "gpu", "host"]
    assert s.value("tfscache_tier_models", node="node1") == 0
    assert s.value("tfscache_gpu_used_bytes", node="node1") == 0
    assert {ls["node"] for ls in s.labelsets("tfscache_gpu_used_bytes")} == {"node0", "node1"}  # node2: down
    cache.models[1] = resident("b", 1, 200)  # promoted: gauges follow the cache at each scrape
    assert scrape(metrics).value("tfscache_tier_models", node="node0", tier="host") == 1


def test_each_metrics_object_has_its_own_registry():
    first, second = Metrics(), Metrics()
    first.request("grpc", "Predict", "OK")
    first.cache_events("node0").hit(("a", 1))
    s1, s2 = scrape(first), scrape(second)
    assert s1.value("tfscache_requests_total", protocol="grpc", method="Predict", code="OK") == 1
    assert s2.value("tfscache_requests_total") == 0
    assert s1.value("tfscache_cache_hits_total") == 1 and s2.value("tfscache_cache_hits_total") == 0


def test_names_follow_prometheus_conventions():
    metrics = Metrics()
    metrics.watch(lambda: [NodeView("node0", FakeCache([resident("a", 1, 10)]), True)], lambda: 1)
    s = scrape(metrics)
    types = {name: f.type for name, f in s.families.items()}
    assert {name for name in types if not name.startswith("tfscache_")} <= {"python_info"} | {
        name for name in types if name.startswith("process_")}
    assert {n for n, t in types.items() if t == "counter" and n.startswith("tfscache_")} == {
        "tfscache_requests", "tfscache_cache_hits", "tfscache_cache_misses", "tfscache_loads",
        "tfscache_load_failures", "tfscache_evictions", "tfscache_unloads", "tfscache_node_restarts",
        "tfscache_forwards", "tfscache_retries", "tfscache_dataplane_routed", "tfscache_tier_moves", "tfscache_tier_move_failures"}
    assert {n for n, t in types.items() if t == "histogram"} == {
        "tfscache_request_duration_seconds", "tfscache_load_duration_seconds", "tfscache_unload_duration_seconds",
        "tfscache_room_wait_seconds", "tfscache_tier_move_duration_seconds"}
    assert {n for n, t in types.items() if t == "gauge" and n.startswith("tfscache_")} == {
        "tfscache_resident_models", "tfscache_resident_bytes", "tfscache_cap_models", "tfscache_cap_bytes",
        "tfscache_used_models", "tfscache_used_bytes", "tfscache_lru_idle_age_seconds",
        "tfscache_leases_in_flight", "tfscache_load_queue_depth", "tfscache_node_healthy", "tfscache_ring_nodes",
        "tfscache_unloads_per_minute", "tfscache_scale_advice", "tfscache_build_info",
        "tfscache_tier_models", "tfscache_tier_bytes", "tfscache_gpu_used_bytes", "tfscache_cap_gpu_bytes",
        "tfscache_dataplane_response_seconds"}
    [build] = s.labelsets("tfscache_build_info")
    assert build["version"] == tfscache.__version__ and s.value("tfscache_build_info") == 1
    assert not [x.name for x in s.samples if x.name.endswith("_created")]
    assert "process_resident_memory_bytes" in {x.name for x in s.samples}
