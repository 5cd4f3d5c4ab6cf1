"""``tfscache simulate --prefetch``: the replay with loads that take time, counted by hand, and the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tfscache.cache.prefetch import CoAccessSettings
from tfscache.cli.simulate import main
from tfscache.sim import build_policy
from tfscache.sim.prefetch import PrefetchConfig, replay_prefetch

LEARNER = CoAccessSettings(window_s=5.0, confidence=0.5, min_support=1.5)


def requests(rows):
    """(model, time, bytes, load seconds) rows -> the engine's per-node requests (one node)."""
    keys: dict[str, int] = {}
    return [(keys.setdefault(name, len(keys)), t, size, cost, 0) for name, t, size, cost in rows]


def pipeline(rounds: int, gap: float = 2.0, between: float = 100.0):
    """a then b ``gap`` s later, ``rounds`` times; c and d in between push a and b out of a 2-model cache."""
    rows, t = [], 0.0
    for _ in range(rounds):
        rows += [("a", t, 10, 1.0), ("b", t + gap, 10, 1.0),
                 ("c", t + between / 3, 10, 1.0), ("d", t + 2 * between / 3, 10, 1.0)]
        t += between
    return sorted(rows, key=lambda row: row[1])


def run(rows, learner, max_models=2, policy="lru"):
    return replay_prefetch(requests(rows), build_policy(policy, max_models, 0),
                           PrefetchConfig(policy, 1, max_models, 0, learner), follow_s=2.5)


def test_without_prefetch_every_request_of_an_evicting_cache_is_cold_and_waits_its_load():
    counts = run(pipeline(5), None)
    assert (counts.requests, counts.cold, counts.followers, counts.cold_followers) == (20, 20, 5, 5)
    assert counts.loads == 20 and counts.load_seconds == 20.0 and counts.wait_seconds == pytest.approx(20.0)
    assert counts.prefetches == counts.used == counts.wasted == 0


def test_a_learned_follower_is_loaded_before_its_request():
    counts = run(pipeline(5), LEARNER)
    # Rounds 1-2 teach a -> b (two pairs >= 1.5); in rounds 3-5 b loads right after a's load, in
    # the second between a's request and b's: b's request is a hit.
    assert counts.cold_followers == 2 and counts.cold == 17
    assert (counts.prefetches, counts.used, counts.wasted) == (3, 3, 0)
    assert counts.load_seconds == 20.0  # the same loads, earlier
    assert counts.wait_seconds == pytest.approx(17.0)


def test_a_follower_sent_when_its_cold_predecessor_answers_loads_beside_it():
    # b's request is sent 0.5 s after a's answer (a pipeline's client waits for a); its log time
    # (0.5 s after a's request, while a loads) only gives the gap.
    off = run(pipeline(5, gap=0.5), None)
    assert (off.cold, off.cold_followers) == (20, 5) and off.wait_seconds == pytest.approx(20.0)
    on = run(pipeline(5, gap=0.5), LEARNER)
    # Rounds 1-2 teach a -> b; in rounds 3-5 b's prefetch is admitted beside a's load (taking the
    # idle d), both end at once, and b's request, sent after a's answer, is a hit.
    assert (on.cold, on.cold_followers) == (17, 2) and on.wait_seconds == pytest.approx(17.0)
    assert (on.prefetches, on.used, on.wasted) == (3, 3, 0) and on.load_seconds == off.load_seconds


def test_the_pair_is_timed_from_the_predecessors_answer_not_its_arrival():
    rows = [(name, t, size, 3.0 if name == "a" else cost) for name, t, size, cost in pipeline(5, gap=0.01)]
    learner = CoAccessSettings(window_s=1.0, confidence=0.5, min_support=1.5)
    # a loads 3 s, longer than the 1 s window; b comes 10 ms after a's answer: still a pair.
    on = run(rows, learner)
    assert on.cold_followers == 2 and (on.prefetches, on.used) == (3, 3)


def test_a_warm_predecessors_follower_joins_its_prefetch_and_waits_less():
    rows = []
    for i in range(4):  # a (warm from round 1 on), b 0.2 s later; a again; y evicts b
        t = 100.0 * i
        rows += [("a", t, 10, 1.0), ("b", t + 0.2, 10, 1.0), ("a", t + 50, 10, 1.0), ("y", t + 60, 10, 1.0)]
    learner = CoAccessSettings(window_s=5.0, confidence=0.3, min_support=1.5)  # b follows half of a's requests
    off, on = run(rows, None), run(rows, learner)
    assert off.cold_followers == on.cold_followers == 4  # b's load cannot end 0.2 s after a hit on a
    # Rounds 0-1 teach a -> b; in rounds 2-3 b's prefetch starts at a's hit (taking the idle y)
    # and b's request joins it: 0.8 s of waiting instead of 1.
    assert (on.prefetches, on.used, on.wasted) == (2, 2, 0)
    assert off.wait_seconds == pytest.approx(9.0) and on.wait_seconds == pytest.approx(8.6)


def test_a_log_without_pipelines_costs_next_to_no_load_seconds():
    rng = random.Random(7)  # 3,000 requests over 100 models, about 1 a second, each load 1 s: no pipeline
    t, rows = 0.0, []
    for _ in range(3000):
        t += rng.expovariate(1.0)
        rows.append((f"m{min(int(rng.paretovariate(0.8)), 100)}", t, 10, 1.0))
    off, on = run(rows, None, max_models=20), run(rows, CoAccessSettings(), max_models=20)  # the defaults
    assert on.load_seconds <= 1.05 * off.load_seconds and on.cold <= 1.05 * off.cold
    assert on.prefetches <= 0.02 * off.loads  # coincidences only


def test_prefetch_never_takes_a_model_gdsf_ranks_hotter():
    rows, t = [], 0.0
    for _ in range(6):  # a (twice) -> b learned; x and y, each requested thrice per round, evict a and b
        rows += [("a", t, 10, 1.0), ("a", t + 1.5, 10, 1.0), ("b", t + 2, 10, 1.0)]
        rows += [(name, t + start + i, 10, 1.0) for name, start in (("x", 60), ("y", 70)) for i in range(3)]
        t += 100.0
    learner = CoAccessSettings(window_s=5.0, confidence=0.4, min_support=1.5)
    # With two slots, b's prefetch after a must evict a or x/y: GDSF ranks each hotter than b would
    # be (x, y: thrice b's requests; a: twice): never.
    counts = run(rows, learner, max_models=2, policy="gdsf")
    assert counts.prefetches == 0
    assert run(rows, learner, max_models=2, policy="lru").prefetches > 0  # LRU ranks y (used before a) colder


def test_the_cli_reports_prefetch_off_and_on(tmp_path: Path, capsys):
    log = tmp_path / "log.csv"
    rows = pipeline(5)
    log.write_text("time,model,version,load_seconds,bytes\n" + "".join(
        f"{t},{name},,{cost},{size}\n" for name, t, size, cost in rows))
    assert main([str(log), "--prefetch", "--policies", "lru", "--max-models", "2", "--json", "--quiet",
                 "--prefetch-window-s", "5", "--prefetch-min-support", "1.5", "--follow-ms", "2500"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["prefetch"], r["cold_followers"], r["used"]) for r in results] == [(False, 5, 0), (True, 2, 3)]
    assert main([str(log), "--prefetch", "--policies", "lru", "--prefetch-confidence", "0", "--quiet"]) == 2
    assert "confidence" in capsys.readouterr().err
