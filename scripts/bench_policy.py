#!/usr/bin/env python3
"""Eviction policies against LRU and the offline bound on load seconds (issue 15; docs/policy.md).

    .venv/bin/python scripts/bench_policy.py --out docs/benchmarks/policy.json

Generates the logs with scripts/gen_zipf_log.py (same seeds: same logs), replays each
through ``tfscache simulate``'s engine (lru, cost, gdsf, Belady's MIN) on 1, 2 and 4 nodes
under count caps and memory caps, solves the offline bound for each (tfscache/sim/bound.py:
the exact optimum under a count cap, the fractional lower bound under a memory cap), and
prints one Markdown table: load seconds as a ratio to LRU's and to the bound.

A fourth reference, ``static``, is a cache told in advance how often each model will be
requested on its node (and nothing about when): it evicts the lowest
``requests x load seconds / bytes``. On a log whose requests are drawn independently
(Zipf, pipeline) that is about the best an online policy can learn; the offline bound
also knows *when* each request comes, which no online policy can.

``--sweep`` instead replays gdsf with half-lives 500..8000 on the zipf1.0, shift and
pipeline logs (2 nodes, 8 and 32 GiB): the trade-off behind the default of 2,000.

Logs (1,000 models, sizes and load times as gen_zipf_log.py draws them):

* ``zipf0.8``, ``zipf1.0``, ``zipf1.2``: Zipf popularity, ``--requests`` requests each;
* ``shift``: Zipf 1.0 over 7 days, a new popularity ranking each day;
* ``pipeline``: Zipf 1.0 where half the requests are followed by one for the model's
  fixed follower (B after A);
* ``issue``: the issue's own log (100,000 requests, seed 7), 2 nodes, 8 and 32 GiB.

Runs in about 10 minutes on 2 cores (the bounds take most of it); ``--requests`` smaller
is faster.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfscache.cache.policy import EvictionPolicy  # noqa: E402
from tfscache.cache.policy.gdsf import GDSFPolicy  # noqa: E402
from tfscache.sim import build_policy  # noqa: E402
from tfscache.sim.bound import cluster_bound  # noqa: E402
from tfscache.sim.engine import BELADY, Config, replay, simulate, split  # noqa: E402
from tfscache.sim.trace import read_trace  # noqa: E402

GiB = 2**30
POLICIES = ["lru", "cost", "gdsf"]
MEMORY = [8 * GiB, 32 * GiB]
COUNTS = [50, 200]
NODES = [1, 2, 4]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_zipf_log", ROOT / "scripts" / "gen_zipf_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StaticOracle(EvictionPolicy):
    """Knows each model's request count on the node in advance: evict the lowest count x seconds / room
    (room: bytes under a memory cap, one slot under a count cap)."""

    name = "static"

    def __init__(self, counts: dict[int, int], by_bytes: bool) -> None:
        self.counts, self.by_bytes = counts, by_bytes
        self.worth: dict = {}

    def record_load(self, key, size_bytes, load_seconds, now) -> None:
        self.worth[key] = self.counts[key] * load_seconds / (max(size_bytes, 1) if self.by_bytes else 1)

    def record_access(self, key, now) -> None:
        pass

    def forget(self, key) -> None:
        self.worth.pop(key, None)

    def victims(self, candidates, now):
        return sorted(candidates, key=lambda key: self.worth.get(key, 0.0))


def static(per_node, max_models: int, memory: int) -> float:
    total = 0.0
    for requests in per_node:
        counts: dict[int, int] = {}
        for request in requests:
            counts[request[0]] = counts.get(request[0], 0) + 1
        total += replay(requests, StaticOracle(counts, bool(memory)), max_models, memory).load_seconds
    return total


def logs(requests: int) -> list[tuple[str, dict, list[int]]]:
    """(name, generator arguments, node counts) of each log."""
    base = {"count": 1000, "requests": requests, "seed": 7, "rate": 100.0}
    return [
        ("zipf0.8", {**base, "alpha": 0.8}, NODES),
        ("zipf1.0", {**base, "alpha": 1.0}, NODES),
        ("zipf1.2", {**base, "alpha": 1.2}, NODES),
        ("shift", {**base, "alpha": 1.0, "days": 7}, NODES),
        ("pipeline", {**base, "alpha": 1.0, "pipeline": 0.5}, NODES),
        ("issue", {**base, "requests": 100_000, "alpha": 1.0}, [2]),
    ]


def run(name: str, path: Path, nodes: list[int], caps: list[tuple[int, int]]) -> list[dict]:
    trace = read_trace(path)
    rows = []
    for n in nodes:
        per_node = split(trace, n)
        for max_models, memory in caps:
            configs = [Config(p, n, max_models, memory) for p in [*POLICIES, BELADY]]
            results = {r.config.policy: r.counts.load_seconds for r in simulate(trace, configs, build_policy)}
            results["static"] = static(per_node, max_models, memory)
            started = time.perf_counter()
            bound = cluster_bound(per_node, max_models, memory)
            rows.append({"log": name, "requests": len(trace), "nodes": n, "max_models": max_models,
                         "memory_bytes": memory, "load_seconds": results, "bound": bound.load_seconds,
                         "exact": bound.exact, "bound_seconds": round(time.perf_counter() - started, 1)})
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    loads, lru, bound = row["load_seconds"], row["load_seconds"]["lru"], row["bound"]
    cap = f"{row['memory_bytes'] // GiB} GiB" if row["memory_bytes"] else f"{row['max_models']} models"
    kind = "optimum" if row["exact"] else "LP bound"
    vs_lru = " | ".join(f"{loads[p] / lru:.3f}" for p in ["cost", "gdsf", "static", BELADY])
    vs_bound = " | ".join(f"{loads[p] / bound:.3f}" for p in ["lru", "cost", "gdsf", "static", BELADY])
    return f"| {row['log']} | {row['nodes']} | {cap} | {lru:.0f} | {vs_lru} | {bound:.0f} ({kind}) | {vs_bound} |"


HEADER = ("| log | nodes | cap per node | LRU load s | cost / LRU | gdsf / LRU | static / LRU | Belady / LRU | "
          "bound load s | LRU / bound | cost / bound | gdsf / bound | static / bound | Belady / bound |\n|" + "---|" * 14)
HALFLIVES = [500, 1000, 2000, 4000, 8000]


def sweep(generator, requests: int, tmp: Path) -> None:
    """gdsf's load seconds over LRU's for each half-life."""
    print("| log | memory per node | " + " | ".join(f"halflife {h}" for h in HALFLIVES) + " |\n|" +
          "---|" * (2 + len(HALFLIVES)))
    for name, spec, _ in logs(requests):
        if name not in ("zipf1.0", "shift", "pipeline"):
            continue
        path = tmp / f"{name}.csv"
        generator.write(generator.generate(**spec), path)
        trace = read_trace(path)
        for memory in MEMORY:
            per_node = split(trace, 2)
            lru = sum(replay(r, build_policy("lru", 0, memory), 0, memory).load_seconds for r in per_node)
            ratios = [sum(replay(r, GDSFPolicy(0, memory, halflife=h), 0, memory).load_seconds for r in per_node) / lru
                      for h in HALFLIVES]
            print(f"| {name} | {memory // GiB} GiB | " + " | ".join(f"{x:.3f}" for x in ratios) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests per log (default 50000)")
    parser.add_argument("--only", help="comma-separated log names to run (default: all)")
    parser.add_argument("--out", type=Path, help="also write every row as JSON here")
    parser.add_argument("--sweep", action="store_true", help="gdsf's half-life against LRU instead (2 nodes)")
    args = parser.parse_args(argv)
    generator = _generator()
    if args.sweep:
        with tempfile.TemporaryDirectory() as tmp:
            sweep(generator, args.requests, Path(tmp))
        return 0
    wanted = set(args.only.split(",")) if args.only else None
    caps = [(0, m) for m in MEMORY] + [(c, 0) for c in COUNTS]
    started, rows = time.perf_counter(), []
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec, nodes in logs(args.requests):
            if wanted is not None and name not in wanted:
                continue
            path = Path(tmp) / f"{name}.csv"
            generator.write(generator.generate(**spec), path)
            rows += run(name, path, nodes, caps if name != "issue" else [(0, m) for m in MEMORY])
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
