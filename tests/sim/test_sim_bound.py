"""The offline bound on load seconds (tfscache/sim/bound.py) against brute force on tiny logs.

Brute force: every schedule a demand cache can follow (on a miss, any set of residents that
holds the requested model and fits the caps), by dynamic programming over resident sets.
Under a count cap the bound must equal that optimum; under a memory cap it must not
exceed it, nor any policy's (or Belady's) load seconds.
"""

from __future__ import annotations

import itertools
import random

import pytest

from tfscache.sim import build_policy, policy_names
from tfscache.sim.bound import cluster_bound, node_bound
from tfscache.sim.engine import BELADY, Config, simulate, split
from tfscache.sim.trace import Trace
from tfscache.cli.simulate import main


def _log(rng: random.Random, requests: int, models: int, sizes=(1, 4), loads=(0.1, 5.0)) -> Trace:
    trace = Trace(models=[(f"m{k}", None) for k in range(models)])
    size = [rng.randint(*sizes) for _ in range(models)]
    load = [round(rng.uniform(*loads), 2) for _ in range(models)]
    for t in range(requests):
        k = min(int(rng.paretovariate(1.0)) - 1, models - 1) if rng.random() < 0.7 else rng.randrange(models)
        trace.keys.append(k)
        trace.times.append(float(t))
        trace.sizes.append(size[k])
        trace.load_seconds.append(load[k])
    return trace


def _brute_force(requests, max_models: int, memory_bytes: int) -> float:
    """The least load seconds of any demand schedule (exponential: tiny logs only)."""
    def fits(keys: frozenset, size: dict) -> bool:
        return (not max_models or len(keys) <= max_models) and (not memory_bytes or sum(size[k] for k in keys)
                                                                <= memory_bytes)

    size: dict[int, int] = {}
    best = {frozenset(): 0.0}  # resident set -> least load seconds to reach it
    for key, _, nbytes, cost, _ in requests:
        if memory_bytes and nbytes > memory_bytes:
            continue  # never cached, never loaded (as in the simulator)
        size[key] = nbytes
        after: dict[frozenset, float] = {}
        for resident, spent in best.items():
            if key in resident:
                options, paid = [resident], spent
            else:
                others = sorted(resident)
                options = [frozenset(kept) | {key} for n in range(len(others) + 1)
                           for kept in itertools.combinations(others, n)]
                paid = spent + cost
            for option in options:
                if fits(option, size) and paid < after.get(option, float("inf")):
                    after[option] = paid
        best = after
    return min(best.values())


@pytest.mark.parametrize("seed", range(12))
def test_under_a_count_cap_the_bound_is_the_exact_optimum(seed):
    rng = random.Random(seed)
    [requests] = split(_log(rng, 14, 5), 1)
    for cap in (1, 2, 3):
        bound = node_bound(requests, max_models=cap)
        assert bound.exact
        assert bound.load_seconds == pytest.approx(_brute_force(requests, cap, 0), abs=1e-6), cap


@pytest.mark.parametrize("seed", range(12))
def test_under_a_memory_cap_the_bound_is_below_the_optimum_and_every_policy(seed):
    rng = random.Random(100 + seed)
    trace = _log(rng, 14, 5)
    [requests] = split(trace, 1)
    for memory in (4, 6, 9):
        bound = node_bound(requests, memory_bytes=memory)
        assert not bound.exact
        optimum = _brute_force(requests, 0, memory)
        assert bound.load_seconds <= optimum + 1e-6
        results = simulate(trace, [Config(p, 1, memory_bytes=memory) for p in [*policy_names(), BELADY]],
                           build_policy)
        assert all(bound.load_seconds <= r.counts.load_seconds + 1e-6 for r in results)
        assert all(optimum <= r.counts.load_seconds + 1e-6 for r in results)  # the brute force is right too


def test_with_both_caps_the_bound_is_below_the_optimum():
    rng = random.Random(5)
    [requests] = split(_log(rng, 14, 5), 1)
    bound = node_bound(requests, max_models=2, memory_bytes=6)
    assert bound.load_seconds <= _brute_force(requests, 2, 6) + 1e-6
    assert bound.load_seconds >= node_bound(requests, max_models=2).load_seconds - 1e-6  # the larger of the two


def test_the_optimum_counts_seconds_not_misses():
    # One slot each for "a" (slow) and one of "b"/"c" (fast), with two slots: keeping "a" costs
    # more misses but fewer seconds. Requests: a b c b c a ...
    trace = Trace(models=[("a", None), ("b", None), ("c", None)])
    for t, k in enumerate([0, 1, 2, 1, 2, 1, 2, 0]):
        trace.keys.append(k)
        trace.times.append(float(t))
        trace.sizes.append(1)
        trace.load_seconds.append(100.0 if k == 0 else 1.0)
    [requests] = split(trace, 1)
    bound = node_bound(requests, max_models=2)
    assert bound.exact and bound.load_seconds == pytest.approx(100 + 1 + 1 + 4 * 1.0)  # "a" kept: b and c thrash
    [belady] = simulate(trace, [Config(BELADY, 1, max_models=2)], build_policy)
    assert belady.counts.load_seconds == pytest.approx(100 + 1 + 1 + 100.0)  # fewest misses: "a" reloaded


def test_no_cap_and_uncacheable_models():
    trace = Trace(models=[("a", None), ("big", None)])
    for t, k in enumerate([0, 1, 0, 1]):
        trace.keys.append(k)
        trace.times.append(float(t))
        trace.sizes.append(10 if k else 1)
        trace.load_seconds.append(2.0 if k else 1.0)
    [requests] = split(trace, 1)
    assert node_bound(requests) == node_bound(requests, max_models=2)
    assert node_bound(requests).load_seconds == pytest.approx(3.0)  # each model's first load only
    assert node_bound(requests, memory_bytes=5).load_seconds == pytest.approx(1.0)  # "big" never loads


def test_a_cluster_bound_sums_its_nodes():
    trace = _log(random.Random(3), 60, 8)
    per_node = split(trace, 2)
    total = cluster_bound(per_node, max_models=2)
    assert total.exact
    assert total.load_seconds == pytest.approx(sum(node_bound(r, max_models=2).load_seconds for r in per_node))


def test_the_command_reports_the_bound_or_says_why_not(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("time,model,load_seconds,bytes\n" + "".join(
        f"{t},m{k},{1 + k},{100 * (1 + k)}\n" for t, k in enumerate([0, 1, 2, 0, 1, 3, 0, 2])), encoding="utf-8")
    assert main([str(log), "--policies", "lru,gdsf", "--max-models", "2", "--quiet"]) == 0
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines()]
    assert [row[0] for row in rows[1:]] == ["lru", "gdsf", BELADY, "optimum"]
    assert rows[0][-1] == "vs_bound" and rows[4][-1] == "1.000"
    assert main([str(log), "--policies", "lru", "--bound-max-requests", "7", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "vs_bound" not in out
    assert err == ("tfscache simulate: no offline bound: the log has 8 requests, more than --bound-max-requests 7 "
                   "(the bound is a linear program over every request; replay a shorter log or raise the limit)\n")
