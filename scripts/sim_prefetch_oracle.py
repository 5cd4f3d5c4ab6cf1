#!/usr/bin/env python
"""The ceiling of co-access prefetch on a pipeline log: the simulator with a learner that knows.

    .venv/bin/python scripts/sim_prefetch_oracle.py pipe.csv [--policy lru] [--max-models 100]

``pipe.csv`` from ``scripts/gen_zipf_log.py --pipeline P`` (its default 10 ms follower gap): each
model's follower is read back from the log (a request exactly 10 ms after the previous one), and
``tfscache.sim.prefetch`` replays the log twice, prefetch off and with an oracle in place of
``CoAccess`` that names that follower after every request of its predecessor (everything else:
the cache's code and default settings). Prints both runs' counts (docs/BENCHMARKS.md, "Co-access
prefetch").
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfscache.cache.prefetch import CoAccessSettings
from tfscache.sim import build_policy
from tfscache.sim import prefetch as sim
from tfscache.sim.engine import split
from tfscache.sim.trace import read_trace

GAP_S = 0.01


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--max-models", type=int, default=100)
    args = parser.parse_args(argv)
    with open(args.log, newline="") as f:
        rows = list(csv.DictReader(f))
    follows = {a["model"]: b["model"] for a, b in zip(rows, rows[1:])
               if abs(float(b["time"]) - float(a["time"]) - GAP_S) < 1e-6}
    trace = read_trace(args.log)
    index = {model[0]: i for i, model in enumerate(trace.models)}
    oracle_map = {index[a]: index[b] for a, b in follows.items()}

    class Oracle:
        """Knows each model's follower; learns nothing."""

        def __init__(self, settings: CoAccessSettings) -> None:
            self.settings = settings

        def arrived(self, key, now: float) -> None:
            pass

        def answered(self, key, now: float) -> None:
            pass

        def followers(self, key) -> list:
            return [oracle_map[key]] if key in oracle_map else []

    requests = split(trace, 1)[0]
    off = sim.replay_prefetch(requests, build_policy(args.policy, args.max_models, 0),
                              sim.PrefetchConfig(args.policy, 1, args.max_models, 0, None))
    sim.CoAccess = Oracle
    on = sim.replay_prefetch(requests, build_policy(args.policy, args.max_models, 0),
                             sim.PrefetchConfig(args.policy, 1, args.max_models, 0, CoAccessSettings()))
    print(f"off:    {off}\noracle: {on}")
    print(f"cold followers {on.cold_followers / off.cold_followers - 1:+.1%}, "
          f"load seconds {on.load_seconds / off.load_seconds - 1:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
