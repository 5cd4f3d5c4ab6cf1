"""GPU and host tiers: the pure rules (tfscache.cache.tiers) and their replay (tfscache.sim.tiers),
counted by hand on tiny logs, and ``tfscache simulate --tiers``."""

from __future__ import annotations

import json
import math

import pytest

from tfscache.cache.tiers import (
    GPU, HOST, PromoteRule, Rates, TierCosts, demote_pays, eviction_cost,
)
from tfscache.cli.simulate import main
from tfscache.sim import build_policy
from tfscache.sim.tiers import TierConfig, simulate_tiers, table
from tfscache.sim.trace import Trace

SIZES = {"A": 100, "B": 200, "C": 300}
LOADS = {"A": 1.0, "B": 2.0, "C": 4.0}


def _trace(models: str) -> Trace:
    """One request a second, one letter a request."""
    trace = Trace()
    index: dict[str, int] = {}
    for t, name in enumerate(models):
        if name not in index:
            index[name] = len(trace.models)
            trace.models.append((name, None))
        trace.keys.append(index[name])
        trace.times.append(float(t))
        trace.load_seconds.append(LOADS[name])
        trace.sizes.append(SIZES[name])
        trace.service.append(-1.0)
    return trace


def _run(models: str, demote: str, **caps):
    config = TierConfig("lru", 1, demote, **{"gpu_models": 1, **caps})
    [result] = simulate_tiers(_trace(models), [config], build_policy)
    return result.counts


# -- the rules --------------------------------------------------------------------------------

def test_a_steady_rate_reads_one_over_the_gap():
    rates = Rates(tau_s=60.0)
    for i in range(2_000):
        rate = rates.request("a", i * 0.5)
    assert rate == pytest.approx(2.0, rel=0.01)
    assert rates.at("a", 999.5 + 600) == pytest.approx(rate * math.exp(-10), rel=1e-6)
    assert rates.at("never", 5.0) == 0.0


def test_promotion_pays_by_rate_or_queue():
    costs = TierCosts(load_s=10.0, promote_s=1.0, gpu_service_s=0.01, host_service_s=0.05)
    rule = PromoteRule(horizon_s=50.0)
    # 0.5 requests/s x 0.04 s saved x 50 s = 1.0 s: just pays the 1 s promotion
    assert rule.pays(0.5, 0, costs)
    assert not rule.pays(0.49, 0, costs)
    assert rule.pays(0.0, rule.queue, costs)
    same = TierCosts(10.0, 1.0, 0.05, 0.05)  # no slower in host memory: only a queue promotes
    assert not rule.pays(1_000.0, 0, same)
    with pytest.raises(ValueError, match="horizon_s"):
        PromoteRule(horizon_s=0)
    with pytest.raises(ValueError, match="promote_s"):
        TierCosts(1.0, -1.0, 0.0, 0.0)


def test_each_tier_prices_an_eviction_by_what_it_loses():
    costs = TierCosts(load_s=10.0, promote_s=1.0, gpu_service_s=0.01, host_service_s=0.05)
    assert eviction_cost(costs, GPU, "none") == 10.0  # back by a cold load
    assert eviction_cost(costs, GPU, HOST) == 1.0  # back by a promotion
    assert eviction_cost(costs, HOST, HOST) == 9.0  # a drop costs a load instead of a promotion
    assert demote_pays(costs) and not demote_pays(TierCosts(1.0, 1.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="disk"):
        eviction_cost(costs, "disk", HOST)


# -- the replay, counted by hand ----------------------------------------------------------------

def test_drop_on_evict_loads_every_miss_cold():
    counts = _run("ABAB", "none")
    assert (counts.gpu_hits, counts.host_hits, counts.cold_loads, counts.drops) == (0, 0, 4, 3)
    assert (counts.promotions, counts.demotions) == (0, 0)
    assert counts.load_seconds == pytest.approx(1 + 2 + 1 + 2)


def test_a_demoted_model_is_answered_from_host_memory():
    # A, B cold (A demoted); A from host memory (at 0.03 req/s a promotion does not pay in 60 s);
    # B still on the GPU
    counts = _run("ABAB", HOST)
    assert (counts.gpu_hits, counts.host_hits, counts.cold_loads) == (1, 1, 2)
    assert (counts.promotions, counts.demotions, counts.drops) == (0, 1, 0)
    assert counts.load_seconds == pytest.approx(3.0)
    assert counts.request_seconds == pytest.approx((1 + 0.01) + (2 + 0.01) + 0.04 + 0.01)
    assert counts.gpu_misses == 3


def test_a_model_is_promoted_when_its_rate_pays_and_the_gpu_victim_is_demoted():
    # horizon 600 s: at ~0.033 req/s, 0.033 x 0.03 s x 600 = 0.59 s >= A's 0.1 s and B's 0.2 s
    counts = _run("ABAB", HOST, horizon_s=600.0)
    assert (counts.gpu_hits, counts.host_hits, counts.cold_loads) == (0, 2, 2)
    assert (counts.promotions, counts.demotions, counts.drops) == (2, 3, 0)
    assert counts.promote_seconds == pytest.approx(0.1 + 0.2)


def test_the_host_tier_drops_by_its_own_cap():
    counts = _run("ABCA", HOST, host_models=1)
    # B's demotion takes the host's one slot from A (dropped), so A loads cold again, and C's
    # demotion then drops B
    assert (counts.cold_loads, counts.demotions, counts.drops, counts.host_hits) == (4, 3, 2, 0)


def test_no_demotion_where_a_promotion_is_no_faster_than_a_load():
    assert _run("ABAB", HOST, promote_ratio=1.0) == _run("ABAB", "none", promote_ratio=1.0)


def test_a_model_above_the_gpu_cap_loads_every_time():
    counts = _run("BBB", HOST, gpu_models=0, gpu_bytes=150)
    assert (counts.cold_loads, counts.uncacheable, counts.gpu_hits) == (3, 3, 0)


def test_the_table_has_a_row_per_configuration():
    trace = _trace("ABCABCAB")
    configs = [TierConfig("lru", 1, d, gpu_models=1) for d in ("none", HOST)]
    text = table(simulate_tiers(trace, configs, build_policy))
    lines = text.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| lru | 1 | none |")
    assert lines[3].startswith("| lru | 1 | host | 1 models | none |")


# -- the command ---------------------------------------------------------------------------------

def test_simulate_tiers_reports_both_modes_as_json(tmp_path, capsys):
    log = tmp_path / "log.csv"
    rows = [f"{t},{m},,{LOADS[m]},{SIZES[m]}" for t, m in enumerate("ABAB")]
    log.write_text("time,model,version,load_seconds,bytes\n" + "\n".join(rows) + "\n")
    code = main([str(log), "--tiers", "--policies", "lru", "--max-models", "1",
                 "--service-ms", "10", "--json", "--quiet"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["demote"], r["cold_loads"], r["host_hits"]) for r in results] == [
        ("none", 4, 0), ("host", 2, 1)]


def test_simulate_tiers_refuses_a_negative_ratio(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("time,model,version,load_seconds,bytes\n0,A,,1,1\n")
    with pytest.raises(SystemExit) as exit_:
        main([str(log), "--tiers", "--promote-ratio", "-1"])
    assert exit_.value.code == 2
    assert "--promote-ratio" in capsys.readouterr().err
