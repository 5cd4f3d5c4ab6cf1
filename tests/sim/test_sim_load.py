"""The load simulation (tfscache/sim/load.py, `tfscache simulate --load`): node time, queues, copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfscache.cluster.copies import CopyRule
from tfscache.cluster.ring import Ring
from tfscache.sim import build_policy
from tfscache.sim.load import LoadConfig, quantile, run_load
from tfscache.sim.loadreport import parse_rules
from tfscache.sim.trace import Trace, read_trace
from tfscache.cli.simulate import main

RING = Ring(["node0", "node1"])
HOT = next(f"m{i}" for i in range(100) if RING.order(f"m{i}") == ("node0", "node1"))
COLD = [f"m{i}" for i in range(100) if RING.owner(f"m{i}") == "node1"][:3]


def _trace(rows) -> Trace:
    """rows: (time, model, service seconds or -1)."""
    trace = Trace()
    index: dict[str, int] = {}
    for when, name, service in rows:
        key = index.setdefault(name, len(index))
        if key == len(trace.models):
            trace.models.append((name, None))
        trace.keys.append(key)
        trace.times.append(when)
        trace.load_seconds.append(1.0)
        trace.sizes.append(100)
        trace.service.append(service)
    return trace


def hot_trace(n: int = 400) -> Trace:
    """A hot model at 20 requests/s (1.4 s of node time per second at 0.07 s each), a cold one on node1."""
    rows = [(i * 0.05, HOT, -1.0) for i in range(n)]
    rows += [(i * 0.5 + 0.01, COLD[i % 3], -1.0) for i in range(n // 10)]
    return _trace(sorted(rows))


def test_one_node_serves_its_requests_in_order_with_queue_waits():
    trace = _trace([(0.0, HOT, 1.0), (0.0, HOT, 1.0), (0.5, HOT, 1.0)])
    result = run_load(trace, LoadConfig(nodes=2, concurrency=1), build_policy)
    # the first waits for the load (1 s), then each waits for the slot
    assert result.waits == [0.0, 1.0, 2.0]
    assert result.latencies == [2.0, 3.0, 3.5]
    assert (result.loads, result.load_seconds, result.busy) == (1, 1.0, [3.0, 0.0])
    assert result.max_over_mean == 2.0


def test_concurrency_runs_requests_side_by_side():
    trace = _trace([(0.0, HOT, 1.0), (0.0, HOT, 1.0)])
    assert run_load(trace, LoadConfig(nodes=2, concurrency=2), build_policy).latencies == [2.0, 2.0]


def test_copies_spread_a_hot_model_and_balance_the_nodes():
    trace = hot_trace()
    fixed = run_load(trace, LoadConfig(nodes=2, service_s=0.07), build_policy)
    spread = run_load(trace, LoadConfig(nodes=2, service_s=0.07, rule=CopyRule(min_load=1)), build_policy)
    assert fixed.max_copies == 1 and fixed.requests_per_node == [400, 40]  # node1: the cold models only
    assert spread.max_copies == 2 and spread.added == 1 and spread.extra_loads == 1
    assert spread.max_over_mean < 1.25 < fixed.max_over_mean
    assert quantile(spread.waits, 0.99) < quantile(fixed.waits, 0.99) / 10
    assert spread.load_seconds == fixed.load_seconds + 1.0  # the copy's one load


def test_caps_hold_and_only_idle_models_are_evicted():
    # node1 capped at 1 model: the cold models take turns, the hot copy waits for an idle slot
    trace = hot_trace(200)
    result = run_load(trace, LoadConfig(nodes=2, service_s=0.1, max_models=1, rule=CopyRule(min_load=1)),
                      build_policy)
    assert len(result.latencies) == len(trace)  # every request answered
    assert result.peak_models == 1 and result.max_copies == 2
    assert result.loads > 1 + len(COLD)  # the cold models and the copy evicted one another


def test_parse_rules():
    assert parse_rules("off") == []
    [(label, rule)] = parse_rules("on:balance=0.25:max_copies=2:signal=inflight")
    assert (label, rule.balance, rule.max_copies, rule.signal) == ("on:balance=0.25:max_copies=2:signal=inflight",
                                                                   0.25, 2, "inflight")
    with pytest.raises(ValueError, match="unknown 'nope'"):
        parse_rules("on:nope=1")


def _log(tmp_path: Path) -> Path:
    lines = ["time,model,version,load_seconds,bytes,service_seconds"]
    trace = hot_trace(100)
    for i, key in enumerate(trace.keys):
        lines.append(f"{trace.times[i]},{trace.models[key][0]},,1.0,100,{'0.1' if i % 2 else ''}")
    path = tmp_path / "log.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_log_gives_service_seconds(tmp_path):
    trace = read_trace(_log(tmp_path))
    assert trace.service[:4] == [-1.0, 0.1, -1.0, 0.1]


def test_the_command_prints_copies_off_and_on(tmp_path, capsys):
    assert main([str(_log(tmp_path)), "--load", "--policies", "lru", "--nodes", "2", "--service-ms", "100",
                 "--copies", "on,on:min_load=1", "--quiet"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert rows == ["copies", "off", "on", "on:min_load=1"]


def test_the_command_writes_json(tmp_path, capsys):
    assert main([str(_log(tmp_path)), "--load", "--policies", "lru", "--nodes", "2", "--json", "--quiet",
                 "--copies", "on:min_load=1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["copies"], r["max_copies"]) for r in doc["results"]] == [(False, 1), (True, 2)]


@pytest.mark.parametrize("args, message", [
    (["--copies", "maybe"], "--copies: copies setting 'maybe'"),
    (["--concurrency", "0"], "--concurrency must be at least 1"),
])
def test_bad_load_arguments_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main([str(_log(tmp_path)), "--load", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
