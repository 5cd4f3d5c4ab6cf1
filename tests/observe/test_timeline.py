"""tfscache.observe.timeline alone, and as NodeEvents feeds it: sequence numbers, the bound,
``since``."""

from __future__ import annotations

import itertools

import pytest

from tfscache.observe.metrics import Metrics
from tfscache.observe.timeline import SIZE, Timeline


def test_sequence_numbers_start_at_one_and_since_returns_only_newer_events():
    clock = itertools.count(100.0)
    timeline = Timeline(clock=lambda: next(clock))
    assert timeline.since(0) == {"seq": 0, "size": SIZE, "dropped": 0, "events": []}
    timeline.record("node0", "loaded", "a", 1, size=10, seconds=0.5)
    timeline.record("node0", "evicted", "a", 1, reason="capacity", size=10)
    timeline.record("node1", "demoted", "b", 2)  # a kind the timeline does not know: kept as is
    doc = timeline.since(0)
    assert doc["seq"] == 3 and [e["seq"] for e in doc["events"]] == [1, 2, 3]
    assert doc["events"][0] == {"seq": 1, "time": 100.0, "node": "node0", "kind": "loaded",
                                "model": "a", "version": 1, "reason": None, "bytes": 10,
                                "seconds": 0.5}
    assert doc["events"][2]["kind"] == "demoted"
    assert [e["seq"] for e in timeline.since(1)["events"]] == [2, 3]
    assert timeline.since(3) == {"seq": 3, "size": SIZE, "dropped": 0, "events": []}
    assert timeline.since(99)["events"] == []  # a client ahead of a restarted serve gets nothing


def test_the_buffer_keeps_the_newest_size_events_and_says_how_many_a_client_missed():
    timeline = Timeline(size=5)
    for i in range(12):
        timeline.record("node0", "loaded", f"m{i}", 1)
    doc = timeline.since(0)
    assert [e["seq"] for e in doc["events"]] == [8, 9, 10, 11, 12]
    assert doc["dropped"] == 7 and doc["size"] == 5
    assert timeline.since(9)["dropped"] == 0 and len(timeline.since(9)["events"]) == 3
    assert timeline.since(6)["dropped"] == 1  # seq 7 is gone


def test_a_timeline_keeps_at_least_one_event():
    with pytest.raises(ValueError, match="at least 1"):
        Timeline(size=0)


def test_node_events_feed_the_metrics_timeline():
    metrics = Metrics(process=False)
    events = metrics.cache_events("node0")
    events.loaded(("a", 1), 1.25, 300, True)
    events.load_failed(("bad", 1), 0.5, RuntimeError("no SavedModel"))
    events.evicted(("a", 1), "capacity", 300)
    events.unloaded(("a", 1), 0.125, 300)
    events.hit(("a", 1))  # hits and misses are counters, not timeline events
    got = [(e["kind"], e["model"], e["reason"], e["bytes"], e["seconds"])
           for e in metrics.timeline.since(0)["events"]]
    assert got == [("loaded", "a", None, 300, 1.25),
                   ("load_failed", "bad", "no SavedModel", None, 0.5),
                   ("evicted", "a", "capacity", 300, None),
                   ("unloaded", "a", None, 300, 0.125)]
    assert {e["node"] for e in metrics.timeline.since(0)["events"]} == {"node0"}
