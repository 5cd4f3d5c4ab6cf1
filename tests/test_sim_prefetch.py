"""``tfscache simulate --prefetch``: the replay with loads that take time, counted by hand, and the CLI."""

from __future__ import annotations

import json
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


def test_a_follower_sooner_than_its_load_joins_the_prefetch_and_still_waits_less():
    counts = run(pipeline(5, gap=0.5), LEARNER)
    # b's request comes 0.5 s after a's, while a loads (1 s): b's prefetch starts only after a's
    # load (a cold request first), so b's request finds it queued and makes it a real load.
    assert counts.cold_followers == 5
    hit_a = [("a", 0.0, 10, 1.0), ("b", 0.2, 10, 1.0)] * 1  # a warm: b's prefetch starts at once
    rows = [(n, t + 10.0 * i, s, c) for i in range(4) for n, t, s, c in hit_a]
    counts = run(rows, LEARNER, max_models=1)  # one model: b's load evicts a, a's load evicts b
    assert counts.cold_followers == 4  # b is never resident at its request


def test_a_log_without_pipelines_prefetches_nothing():
    rows = [(name, float(i), 10, 1.0) for i, name in enumerate("abcdabdcacbd" * 3)]
    off, on = run(rows, None, max_models=3), run(rows, LEARNER, max_models=3)
    assert on.prefetches == 0
    assert (on.cold, on.load_seconds, on.wait_seconds) == (off.cold, off.load_seconds, off.wait_seconds)


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
