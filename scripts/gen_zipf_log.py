#!/usr/bin/env python3
"""Write a synthetic request log for ``tfscache simulate``: Zipf popularity, varied models.

    python scripts/gen_zipf_log.py --models 1000 --requests 100000 --alpha 1.0 --seed 1 --out zipf.csv

* Popularity: the model of popularity rank r is requested with probability
  proportional to 1 / r ** alpha; ranks are shuffled over the model names, so name
  order says nothing about popularity or size.
* Sizes: log-normal (median 100 MB, sigma 1.5), clipped to [1 MB, 2 GB].
* Load times: 0.2 s plus size / 200 MB/s, times log-normal noise (sigma 0.5): larger
  models load slower, but two models of one size can differ by a factor of 3 or more.
* Arrivals: a Poisson process of ``--rate`` requests per second, starting at time 0.
* ``--days D`` (a daily shift): the log spans D days (the rate becomes requests / D days)
  and each day has its own popularity ranking, reshuffled at midnight, so yesterday's
  favourites are today's long tail.
* ``--pipeline P`` (pipelines where B follows A): each model has one follower, fixed for
  the log; a request is followed, with probability P, by a request for its model's follower
  10 ms later (as a two-stage inference would send it; ``--follow-ms`` changes the gap),
  before the next arrival.
  ``--requests`` counts both.

Each model keeps its size and load time on every line. The output is the same for
the same arguments (Python's own ``random`` with the seed; no numpy). ``.csv`` gets a
header row; ``.jsonl`` one object per line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from pathlib import Path

MB = 1_000_000
MIN_BYTES, MAX_BYTES = 1 * MB, 2_000 * MB


def models(count: int, rng: random.Random) -> list[tuple[str, int, float]]:
    """(name, bytes, load seconds) for each model."""
    width = len(str(count - 1))
    out = []
    for i in range(count):
        size = int(min(MAX_BYTES, max(MIN_BYTES, rng.lognormvariate(math.log(100 * MB), 1.5))))
        load = (0.2 + size / (200 * MB)) * rng.lognormvariate(0.0, 0.5)
        out.append((f"model{i:0{width}d}", size, round(load, 3)))
    return out


DAY = 86_400.0
FOLLOW_S = 0.01


def generate(count: int, requests: int, alpha: float, seed: int, rate: float, days: int = 0,
             pipeline: float = 0.0, follow_s: float = FOLLOW_S) -> list[tuple[float, str, float, int]]:
    """(time, model, load seconds, bytes) for each request."""
    rng = random.Random(seed)
    table = models(count, rng)
    ranked = table[:]
    rng.shuffle(ranked)  # ranked[r] has popularity rank r + 1
    weights = list(itertools.accumulate(1.0 / (r + 1) ** alpha for r in range(count)))
    ranks = rng.choices(range(count), cum_weights=weights, k=requests)
    if days:
        rate = requests / (days * DAY)
    follower = dict(zip(table, rng.sample(table, len(table)))) if pipeline else {}
    now, day, rows = 0.0, 0, []
    for rank in ranks:
        if len(rows) >= requests:
            break
        now += rng.expovariate(rate)
        if days and int(now // DAY) != day:  # midnight: a new ranking for the new day
            day = int(now // DAY)
            rng.shuffle(ranked)
        name, size, load = model = ranked[rank]
        rows.append((round(now, 6), name, load, size))
        if pipeline and len(rows) < requests and rng.random() < pipeline:
            name, size, load = follower[model]
            now += follow_s  # the next arrival comes after it: the log stays in time order
            rows.append((round(now, 6), name, load, size))
    return rows


def write(rows: list[tuple[float, str, float, int]], out: Path) -> None:
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        if out.suffix == ".jsonl":
            for t, name, load, size in rows:
                f.write(json.dumps({"time": t, "model": name, "load_seconds": load, "bytes": size}) + "\n")
        else:
            f.write("time,model,version,load_seconds,bytes\n")
            f.writelines(f"{t},{name},,{load},{size}\n" for t, name, load, size in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000, help="distinct models (default 1000)")
    parser.add_argument("--requests", type=int, default=100_000, help="requests (default 100000)")
    parser.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent (default 1.0)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    parser.add_argument("--days", type=int, default=0, help="spread the log over this many days, with a new "
                        "popularity ranking each day (default 0: one ranking, --rate applies)")
    parser.add_argument("--pipeline", type=float, default=0.0, help="probability that a request is followed by one "
                        "for its model's fixed follower (default 0)")
    parser.add_argument("--follow-ms", type=float, default=FOLLOW_S * 1000, help="with --pipeline: milliseconds "
                        "from a request to its follower's (default 10)")
    parser.add_argument("--out", type=Path, required=True, help="output file, .csv or .jsonl")
    args = parser.parse_args(argv)
    if args.models < 1 or args.requests < 0 or args.alpha < 0 or args.rate <= 0 or args.days < 0:
        parser.error("--models must be >= 1, --requests, --alpha and --days >= 0, --rate > 0")
    if not 0.0 <= args.pipeline <= 1.0:
        parser.error(f"--pipeline must be a probability in [0, 1], got {args.pipeline}")
    if args.out.suffix not in (".csv", ".jsonl"):
        parser.error(f"--out must end in .csv or .jsonl, got {args.out}")
    write(generate(args.models, args.requests, args.alpha, args.seed, args.rate, args.days, args.pipeline,
                   args.follow_ms / 1000), args.out)
    print(f"wrote {args.requests} requests for {args.models} models to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
