"""tfscache.observe.requestlog and the request accounting of tfscache.observe.metrics, without a server: rows
written by the writer thread, read back by the simulator's own reader."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from tfscache import logs
from tfscache.observe.gauges import lru_idle_age
from tfscache.observe.metrics import Metrics
from tfscache.observe.requestlog import COLUMNS, RequestLog, RequestLogError
from tfscache.sim.trace import read_trace

from .promtext import Scrape
from support.fakecache import resident as entry


def one_request(metrics: Metrics, served=None, code: str = "OK") -> None:
    """What a front end does: begin, the cache's event in the same task, then the accounting."""
    started = metrics.begin()
    if served is not None:
        served()
    metrics.request("grpc", "Predict", code, started)


async def test_rows_of_served_requests_with_the_last_load_of_their_model(tmp_path):
    log = RequestLog(tmp_path / "requests.csv")
    metrics = Metrics(request_log=log, process=False)
    events = metrics.cache_events("node0")
    await log.start()

    def cold():
        events.miss(("a", 1))
        events.loaded(("a", 1), 0.5, 1000, True)

    one_request(metrics, cold)
    one_request(metrics, lambda: events.hit(("a", 1)))
    one_request(metrics)  # no lease on a local node (an unknown model, a forward): no row
    one_request(metrics, lambda: events.miss(("b", 2)), code="RESOURCE_EXHAUSTED")  # never loaded here
    await log.close()
    lines = (tmp_path / "requests.csv").read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 4
    rows = [dict(zip(COLUMNS, line.split(","))) for line in lines[1:]]
    assert [(r["model"], r["version"], r["load_seconds"], r["bytes"], r["node"], r["cold"], r["code"])
            for r in rows] == [("a", "1", "0.5", "1000", "node0", "1", "OK"), ("a", "1", "0.5", "1000", "node0", "0", "OK"),
                               ("b", "2", "0.0", "0", "node0", "1", "RESOURCE_EXHAUSTED")]
    trace = read_trace(tmp_path / "requests.csv")
    assert (len(trace), trace.models, trace.load_seconds[:2], trace.sizes[:2]) == (
        3, [("a", 1), ("b", 2)], [0.5, 0.5], [1000, 1000])


async def test_json_lines_and_appending_to_an_existing_log(tmp_path):
    path = tmp_path / "requests.jsonl"
    for run in range(2):  # a restart appends
        log = RequestLog(path)
        metrics = Metrics(request_log=log, process=False)
        await log.start()
        one_request(metrics, lambda: metrics.cache_events("node1").hit(("m", 3)))
        await log.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["model"], r["version"], r["node"], r["cold"]) for r in rows] == [("m", 3, "node1", 0)] * 2
    assert set(rows[0]) == set(COLUMNS)
    assert len(read_trace(path)) == 2


async def test_a_csv_with_other_columns_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "theirs.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(RequestLogError, match="theirs.csv: it exists with other columns"):
        await RequestLog(path).start()
    assert path.read_text() == "a,b,c\n1,2,3\n"
    with pytest.raises(RequestLogError, match="cannot open it"):
        await RequestLog(tmp_path).start()  # a directory


def test_latency_carries_the_model_only_when_asked():
    for per_model in (False, True):
        metrics = Metrics(per_model=per_model, process=False)
        started = metrics.begin()
        logs.bind(model="m1")
        metrics.request("rest", "Predict", "200", started)
        logs.bind(model=None)
        s = Scrape(generate_latest(metrics.registry).decode())
        [labels] = s.labelsets("tfscache_request_duration_seconds_count")
        expected = {"protocol": "rest", "method": "Predict", "code": "200"}
        assert labels == ({**expected, "model": "m1"} if per_model else expected)
        assert s.value("tfscache_request_duration_seconds_bucket", le="60.0") == 1


def test_the_lru_idle_age_is_of_the_oldest_idle_model_that_may_be_evicted():
    resident = [entry("a", size=1, last_use=90.0), entry("b", size=1, leases=1, last_use=10.0),
                entry("c", size=1, state="loading", last_use=5.0),
                entry("d", size=1, last_use=20.0, pinned=True)]
    assert lru_idle_age(resident, now=100.0) == 10.0  # b is leased, c loading, d pinned
    assert lru_idle_age(resident[1:], now=100.0) is None


async def test_rows_only_writes_the_row_and_counts_nothing(tmp_path):
    """The control process's internal listeners (--workers N): the worker counted the request."""
    log = RequestLog(tmp_path / "requests.csv")
    metrics = Metrics(request_log=log, process=False)
    events = metrics.cache_events("node0")
    rows = metrics.rows_only()
    await log.start()
    started = rows.begin()
    events.miss(("a", 1))
    events.loaded(("a", 1), 0.5, 1000, True)
    rows.request("grpc", "Predict", "OK", started)
    started = rows.begin()  # no lease on a local node: no row
    rows.request("grpc", "Predict", "NOT_FOUND", started)
    await log.close()
    trace = read_trace(tmp_path / "requests.csv")
    assert (len(trace), trace.models, trace.load_seconds, trace.sizes) == (1, [("a", 1)], [0.5], [1000])
    seen = Scrape(generate_latest(metrics.registry).decode())
    assert seen.value("tfscache_requests_total") == 0
    assert seen.value("tfscache_request_duration_seconds_count") == 0
    assert seen.value("tfscache_cache_misses_total") == 1  # the cache's own events still count
