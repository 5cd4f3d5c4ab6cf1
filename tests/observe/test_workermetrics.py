"""tfscache.observe.workermetrics alone: workers' snapshots summed into the control process's /metrics.

Each "worker" here is a real ``Metrics`` (its own registry) counting requests as a front end
does; its ``snapshot`` goes through JSON as it would over the control channel.
"""

from __future__ import annotations

import json
from unittest import mock

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from tfscache.observe.metrics import REQUEST_BUCKETS, Metrics
from tfscache.observe.workermetrics import Snapshots, snapshot

from .promtext import Scrape


def requests(metrics: Metrics, n: int, code: str = "OK", seconds: float | None = None) -> None:
    """``n`` answered Predict requests, each of exactly ``seconds`` latency when given (the clock
    stands still between begin and request: a preempted test must not move a bucket)."""
    for _ in range(n):
        with mock.patch("tfscache.observe.metrics.time.perf_counter", return_value=1000.0):
            started = metrics.begin()
            if seconds is not None:
                started -= seconds
            metrics.request("grpc", "Predict", code, started)


def wire(snap: dict, pid: int | None = None) -> dict:
    """The snapshot as the control process receives it (JSON), under another pid if asked."""
    snap = json.loads(json.dumps(snap))
    if pid is not None:
        snap["pid"] = pid
    return snap


def scrape(metrics: Metrics) -> Scrape:
    """What /metrics serves (observe/server.py): the merged view, through prometheus_client's parser."""
    return Scrape(generate_latest(metrics.exported).decode())


def test_a_snapshot_is_json_and_leaves_out_what_belongs_to_one_process():
    worker = Metrics()  # with the process collectors, as a careless worker might build it
    requests(worker, 2)
    snap = snapshot(worker.registry)
    assert json.loads(json.dumps(snap)) == snap
    names = {f["name"] for f in snap["families"]}
    assert {"tfscache_requests", "tfscache_request_duration_seconds", "tfscache_cache_hits"} <= names
    assert not {n for n in names if n.startswith("process_")}
    assert not names & {"python_info", "tfscache_build", "tfscache_ring_nodes", "tfscache_scale_advice"}
    requests_family = next(f for f in snap["families"] if f["name"] == "tfscache_requests")
    assert requests_family["samples"] == [
        ["tfscache_requests_total", {"protocol": "grpc", "method": "Predict", "code": "OK"}, 2.0]]


def test_requests_of_every_worker_and_the_control_process_are_summed():
    control = Metrics(process=False)
    requests(control, 1)
    one, two = Metrics(process=False), Metrics(process=False)
    requests(one, 3)
    requests(two, 5)
    requests(two, 2, code="NOT_FOUND")
    control.exported.update(1, wire(snapshot(one.registry), pid=101))
    control.exported.update(2, wire(snapshot(two.registry), pid=102))
    assert [control.exported.counted(w, "tfscache_requests_total") for w in (1, 2, 3)] == [3, 7, 0]
    seen = scrape(control)
    assert seen.value("tfscache_requests_total", code="OK") == 9
    assert seen.value("tfscache_requests_total", code="NOT_FOUND") == 2
    assert seen.value("tfscache_request_duration_seconds_count") == 11
    # the control process's own per-process families are there once, not summed away or doubled
    assert len(seen.labelsets("tfscache_build_info")) == 1
    assert seen.value("tfscache_ring_nodes") == 0


def test_histogram_buckets_stay_cumulative_and_sum_per_label_set():
    control = Metrics(process=False)
    one, two = Metrics(process=False), Metrics(process=False)
    requests(one, 4, seconds=0.003)  # the 5 ms bucket and above
    requests(two, 2, seconds=0.2)  # the 250 ms bucket and above
    requests(two, 1, code="UNAVAILABLE", seconds=0.02)
    control.exported.update("a", wire(snapshot(one.registry), pid=1))
    control.exported.update("b", wire(snapshot(two.registry), pid=2))
    seen = scrape(control)
    ok = [(float(s.labels["le"]), s.value) for s in seen.samples
          if s.name == "tfscache_request_duration_seconds_bucket" and s.labels["code"] == "OK"]
    assert [le for le, _ in ok] == [*REQUEST_BUCKETS, float("inf")]
    counts = [value for _, value in ok]
    assert counts == sorted(counts)  # cumulative
    assert dict(ok)[0.0025] == 0 and dict(ok)[0.005] == 4 and dict(ok)[0.1] == 4 and dict(ok)[0.25] == 6
    assert dict(ok)[float("inf")] == seen.value("tfscache_request_duration_seconds_count", code="OK") == 6
    assert seen.value("tfscache_request_duration_seconds_count", code="UNAVAILABLE") == 1
    assert abs(seen.value("tfscache_request_duration_seconds_sum", code="OK") - (4 * 0.003 + 2 * 0.2)) < 0.01


def test_a_restarted_worker_never_lowers_a_counter():
    control = Metrics(process=False)
    first = Metrics(process=False)
    requests(first, 7)
    control.exported.update(0, wire(snapshot(first.registry), pid=200))
    before = scrape(control)
    assert before.value("tfscache_requests_total") == 7
    # SIGKILLed: the control process retires it; its replacement counts from 0 under the same id
    control.exported.retire(0)
    assert scrape(control).value("tfscache_requests_total") == 7
    second = Metrics(process=False)
    control.exported.update(0, wire(snapshot(second.registry), pid=201))
    assert scrape(control).value("tfscache_requests_total") == 7
    requests(second, 2)
    control.exported.update(0, wire(snapshot(second.registry), pid=201))
    after = scrape(control)
    assert after.value("tfscache_requests_total") == 9
    assert after.value("tfscache_request_duration_seconds_count") == 9
    assert after.value("tfscache_request_duration_seconds_bucket", le="+Inf") == 9


def test_a_new_pid_under_the_same_id_retires_the_old_one_and_late_reports_are_ignored():
    control = Metrics(process=False)
    old, new = Metrics(process=False), Metrics(process=False)
    requests(old, 4)
    control.exported.update(3, wire(snapshot(old.registry), pid=300))
    requests(new, 1)
    control.exported.update(3, wire(snapshot(new.registry), pid=301))  # no retire call: the pid tells
    assert scrape(control).value("tfscache_requests_total") == 5
    requests(old, 10)  # a report from the dead process that arrived late: not counted twice
    control.exported.update(3, wire(snapshot(old.registry), pid=300))
    assert scrape(control).value("tfscache_requests_total") == 5
    assert control.exported.workers() == [3]


def test_a_dead_workers_gauge_is_gone_and_a_live_ones_is_summed():
    control = Metrics(process=False)
    workers = []
    for n in (2, 3):
        registry = CollectorRegistry()
        Gauge("tfscache_worker_in_flight", "Requests in flight on a worker.", registry=registry).set(n)
        workers.append(registry)
    control.exported.update("a", wire(snapshot(workers[0]), pid=1))
    control.exported.update("b", wire(snapshot(workers[1]), pid=2))
    assert scrape(control).value("tfscache_worker_in_flight") == 5
    control.exported.retire("a")
    seen = scrape(control)
    assert seen.value("tfscache_worker_in_flight") == 3
    control.exported.retire("b")
    assert scrape(control).labelsets("tfscache_worker_in_flight") == []


def test_hit_counts_in_status_include_the_workers():
    control = Metrics(process=False)
    control.cache_events("node0").hit(("m", 1))
    worker = Metrics(process=False)
    for _ in range(3):
        worker.cache_events("node0").hit(("m", 1))
    worker.cache_events("node0").miss(("m", 1))
    assert control.hit_counts() == (1, 0)
    control.exported.update(1, wire(snapshot(worker.registry), pid=9))
    assert control.hit_counts() == (4, 1)


def test_without_workers_metrics_is_exactly_the_registry():
    control = Metrics(process=False)
    requests(control, 2, seconds=0.01)
    assert generate_latest(control.exported) == generate_latest(control.registry)
    assert not control.exported.merging


def test_the_merged_text_parses_with_every_family_once():
    control = Metrics(process=False, per_model=True)
    worker = Metrics(process=False, per_model=True)
    requests(worker, 1, seconds=0.001)
    worker.cache_events("node1").loaded(("m", 2), 0.4, 10, True)  # a family the control has no series of
    control.exported.update(0, wire(snapshot(worker.registry), pid=5))
    text = generate_latest(control.exported).decode()
    seen = Scrape(text)
    assert seen.value("tfscache_loads_total", node="node1", model="m") == 1
    assert seen.value("tfscache_load_duration_seconds_bucket", node="node1", model="m", le="0.5") == 1
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps))


class Clock:
    """A fake monotonic clock; ``cost`` seconds pass during each snapshot (between its two reads)."""

    def __init__(self) -> None:
        self.now, self.cost, self.reads = 100.0, 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the read after a snapshot
            self.now += self.cost
        return self.now


def test_snapshots_only_when_requests_were_answered_at_most_every_interval():
    worker, clock = Metrics(process=False), Clock()
    snaps = Snapshots(worker, every_s=0.5, share=0.05, clock=clock)
    first = snaps.take()
    assert first is not None and first["families"]  # the first report carries one
    requests(worker, 3)
    clock.now += 0.2
    assert snaps.take() is None  # answered, but within every_s of the last one
    clock.now += 0.4
    snap = snaps.take()
    assert snap is not None
    assert next(f for f in snap["families"] if f["name"] == "tfscache_requests")["samples"][0][2] == 3
    clock.now += 5.0
    assert snaps.take() is None  # nothing answered since
    assert snaps.take(force=True) is not None  # the last report, at a drain, always carries one


def test_a_costly_snapshot_waits_longer():
    worker, clock = Metrics(process=False), Clock()
    clock.cost = 0.1  # each snapshot takes 100 ms: at most 5 % of the time means every 2 s
    snaps = Snapshots(worker, every_s=0.5, share=0.05, clock=clock)
    assert snaps.take() is not None
    requests(worker, 1)
    clock.now += 1.5
    assert snaps.take() is None
    clock.now += 0.5
    assert snaps.take() is not None
