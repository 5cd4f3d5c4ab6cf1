"""Prefetch in the request log (its ``prefetched`` column, old logs still appended to and replayed)
and in Prometheus (tfscache.observe.prefetchmetrics), without a server."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from tfscache.cache.prefetch import PrefetchCounts
from tfscache.observe.gauges import NodeView
from tfscache.observe.metrics import Metrics
from tfscache.observe.prefetchmetrics import PrefetchCollector
from tfscache.observe.requestlog import COLUMNS, LEGACY_COLUMNS, RequestLog
from tfscache.sim.trace import read_trace

from .test_request_log import one_request


async def test_a_request_served_by_a_prefetched_load_is_marked(tmp_path):
    log = RequestLog(tmp_path / "requests.csv")
    metrics = Metrics(request_log=log, process=False)
    events = metrics.cache_events("node0")
    await log.start()

    def first_use():  # a hit on a prefetched model: the cache tells the request's task
        events.hit(("b", 1))
        events.prefetch_used(("b", 1))

    one_request(metrics, first_use)
    one_request(metrics, lambda: events.hit(("b", 1)))
    await log.close()
    lines = (tmp_path / "requests.csv").read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and COLUMNS[-1] == "prefetched"
    assert [dict(zip(COLUMNS, line.split(",")))["prefetched"] for line in lines[1:]] == ["1", "0"]
    assert len(read_trace(tmp_path / "requests.csv")) == 2


async def test_a_log_begun_without_the_column_keeps_its_columns_and_replays(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text(",".join(LEGACY_COLUMNS) + "\r\n" + "1.0,a,1,0.5,1000,node0,1,OK\r\n")
    log = RequestLog(path)
    metrics = Metrics(request_log=log, process=False)
    await log.start()
    one_request(metrics, lambda: metrics.cache_events("node0").hit(("a", 1)))
    await log.close()
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(LEGACY_COLUMNS) and len(lines) == 3
    assert len(lines[2].split(",")) == len(LEGACY_COLUMNS)
    trace = read_trace(path)
    assert (len(trace), trace.models) == (2, [("a", 1)])


def test_prefetch_loads_by_node_and_outcome():
    counts = PrefetchCounts()
    counts.count("started", 3)
    counts.count("used", 2)
    views = [NodeView("node0", SimpleNamespace(prefetch_counts=counts), True),
             NodeView("node1", SimpleNamespace(prefetch_counts=None), True),  # prefetch off: no series
             NodeView("node2", None, False)]  # down
    registry = CollectorRegistry()
    registry.register(PrefetchCollector(lambda: views))
    text = generate_latest(registry).decode()
    assert 'tfscache_prefetch_loads_total{node="node0",outcome="started"} 3.0' in text
    assert 'tfscache_prefetch_loads_total{node="node0",outcome="used"} 2.0' in text
    assert 'tfscache_prefetch_loads_total{node="node0",outcome="wasted"} 0.0' in text
    assert "node1" not in text and "node2" not in text


def test_status_shows_each_nodes_prefetch_counts():
    from tfscache.cli.status import render
    from tfscache.frontend.backends import NodeBackend
    from tfscache.observe.server import status_document

    from .test_status_document import FakeCache, FakeUpstream, topology

    counts = PrefetchCounts()
    counts.count("started", 4)
    counts.count("completed", 3)
    counts.count("used", 2)
    on, off = FakeCache([]), FakeCache([])
    on.prefetch_counts = counts
    doc = status_document(Metrics(process=False), topology([NodeBackend("node0", FakeUpstream("127.0.0.1:1"), on),
                                                            NodeBackend("node1", FakeUpstream("127.0.0.1:2"), off)]))
    assert [n["prefetch"] for n in doc["nodes"]] == [
        {"started": 4, "completed": 3, "failed": 0, "used": 2, "wasted": 0}, None]
    text = render(doc)
    assert "prefetch on node0: 4 started, 3 completed, 0 failed, 2 used, 0 wasted" in text
    assert "prefetch on node1" not in text
