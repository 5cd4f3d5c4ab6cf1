"""``tfscache simulate``: replay a request log against eviction policies, node counts and caps.

    tfscache simulate requests.csv --policies lru,fifo,lfu,cost --nodes 1,2,4 \\
        --max-models 50,100,200 --memory 16GiB --plot hits.png

Every combination of policy, node count, ``--max-models`` and ``--memory`` (per-node
caps; 0 is no cap) is replayed with the policy classes the cache manager runs, and
Belady's MIN is replayed under the same caps as the reference for hits. For logs of at
most ``--bound-max-requests`` requests, each node count and caps also gets the offline
bound on load seconds (tfscache/sim/bound.py: the exact optimum under a count cap, the
fractional one, a lower bound, under a memory cap), and every row its load seconds as a
ratio to it. The table (or, with ``--json``, a JSON document) goes to stdout; the log
format is in tfscache/sim/trace.py and the cache model in tfscache/sim/engine.py. The
progress bar and the summary line go to stderr (``--progress``/``--no-progress``/``--quiet``:
tfscache.cli.options). ``--prefetch`` replays each combination with co-access prefetch off and on
(tfscache/sim/prefetch.py: loads take time there) and reports cold requests, cold follower requests,
load seconds and wait instead. ``--tiers`` replays each combination with a
GPU tier only (drop on evict) and with demotion to a host tier (tfscache/sim/tiers.py).
``--plot`` needs the ``[sim]`` extra (matplotlib): without it the command
exits 2 before simulating.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import sys
import time
from pathlib import Path

from tfscache.cli.options import Parser, add_output_flags, bar_disable
from tfscache.extras import MissingExtra, require
from tfscache.sim import build_policy, policy_names
from tfscache.sim.bound import MAX_REQUESTS, Bound, cluster_bound
from tfscache.sim import loadreport
from tfscache.sim.engine import BELADY, Config, simulate, split
from tfscache.sim.load import run_load
from tfscache.sim.trace import TraceError, read_trace
from tfscache.units import parse_bytes

log = logging.getLogger("tfscache.cli.simulate")

def _list(convert, what: str):
    def parse(text: str) -> list:
        values = []
        for item in text.split(","):
            try:
                value = convert(item.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"bad {what} {item.strip()!r} in {text!r}"
                ) from None
            if value < 0:
                raise argparse.ArgumentTypeError(
                    f"{what} must not be negative, got {item.strip()!r}"
                )
            values.append(value)
        return list(dict.fromkeys(values))
    return parse


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad request count {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"request count must not be negative, got {text!r}")
    return value


def _policies(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = policy_names()
    for name in names:
        if name not in known and name != BELADY:
            raise argparse.ArgumentTypeError(f"unknown policy {name!r}; known: {', '.join(known)}")
    return [name for name in dict.fromkeys(names) if name != BELADY]


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tfscache simulate",
        description="Replay a request log (CSV or JSONL: time, model, [version], "
        "load_seconds, bytes) against eviction policies, node counts and per-node caps; "
        "Belady's MIN is the bound.",
    )
    parser.add_argument(
        "log", type=Path, help="request log, .csv (with a header row) or .jsonl; .gz is read too"
    )
    parser.add_argument(
        "--policies",
        type=_policies,
        default=["lru", "fifo", "lfu", "cost", "gdsf"],
        help=f"comma-separated policies (default lru,fifo,lfu,cost,gdsf; known: "
        f"{', '.join(policy_names())})",
    )
    parser.add_argument(
        "--nodes",
        type=_list(int, "node count"),
        default=[1],
        help="comma-separated node counts (default 1); requests are routed by tfscache's ring",
    )
    parser.add_argument("--max-models", type=_list(int, "model count"), default=[0],
                        help="comma-separated caps on models per node (default 0: no cap)")
    parser.add_argument(
        "--memory",
        type=_list(parse_bytes, "size"),
        default=[0],
        help="comma-separated caps on bytes per node, e.g. 4GiB,16GiB (default 0: no cap)",
    )
    parser.add_argument(
        "--bound-max-requests",
        type=_count,
        default=MAX_REQUESTS,
        metavar="N",
        help=f"solve the offline bound on load seconds only for logs of at most N "
        f"requests (default {MAX_REQUESTS}; 0: never)",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="write a plot of hit ratio against capacity"
    )
    load = parser.add_argument_group(
        "load",
        "--load: requests take node time and copies follow load "
        "(tfscache/sim/load.py); copies off (fixed replicas) is always run",
    )
    load.add_argument(
        "--load", action="store_true", help="simulate node time, queues and copies (docs/copies.md)"
    )
    load.add_argument(
        "--service-ms",
        type=float,
        default=30.0,
        help="node milliseconds per request where the log has no service_seconds (default 30)",
    )
    load.add_argument(
        "--concurrency", type=int, default=1, help="requests a node runs at once (default 1)"
    )
    load.add_argument(
        "--copies",
        default="on",
        metavar="on[:NAME=VALUE...],...",
        help="copies settings to run against copies off (default on: the [copies] defaults), "
        "e.g. on,on:balance=0.25:hot_share=0.3",
    )
    tiers = parser.add_argument_group(
        "tiers",
        "--tiers: GPU and host tiers, drop-on-evict against demotion to host memory "
        "(tfscache/sim/tiers.py, docs/tiers.md); --max-models caps the GPU tier's models",
    )
    tiers.add_argument(
        "--tiers", action="store_true", help="replay with cache.demote none and host"
    )
    tiers.add_argument("--gpu-memory", type=_list(parse_bytes, "size"), default=[0],
                       help="comma-separated GPU caps in bytes per node (default 0: no cap)")
    tiers.add_argument("--host-memory", type=_list(parse_bytes, "size"), default=[0],
                       help="comma-separated host-tier caps in bytes per node (default 0: no cap)")
    tiers.add_argument("--host-models", type=_count, default=0,
                       help="cap on the host tier's models per node (default 0: no cap)")
    tiers.add_argument("--promote-ratio", type=float, default=0.1,
                       help="a promotion from host memory takes this share of the version's "
                       "load seconds (default 0.1)")
    tiers.add_argument("--host-slowdown", type=float, default=4.0,
                       help="a request answered from host memory takes this many times the GPU's "
                       "service time (default 4)")
    tiers.add_argument("--promote-horizon-s", type=float, default=60.0,
                       help="promote when the service seconds saved over this horizon at the "
                       "model's rate reach the promotion's (default 60)")
    parser.add_argument(
        "--prefetch",
        action="store_true",
        help="replay with co-access prefetch off and on, with the "
        "cache's default prefetch_* settings (docs/prefetch.md)",
    )
    parser.add_argument(
        "--prefetch-window-s",
        type=float,
        help="--prefetch: cache.prefetch_window_s (default: " "the setting's)",
    )
    parser.add_argument(
        "--prefetch-confidence", type=float, help="--prefetch: cache.prefetch_confidence"
    )
    parser.add_argument(
        "--prefetch-min-support", type=float, help="--prefetch: cache.prefetch_min_support"
    )
    parser.add_argument(
        "--follow-ms",
        type=float,
        default=50.0,
        help="--prefetch: a request this many ms or less "
        "after its node's previous one, for another model, counts as a follower (default 50)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON report instead of the table"
    )
    add_output_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if 0 in args.nodes:
        parser.error("--nodes: a node count must be at least 1")
    if not args.policies:
        parser.error("--policies: name at least one policy")
    if args.plot is not None:
        if not args.plot.parent.is_dir():  # found now, not after the whole simulation
            parser.error(f"argument --plot: cannot write the plot {str(args.plot)!r}: "
                         f"no directory {str(args.plot.parent)!r}")
        try:
            require("sim", "--plot")
        except MissingExtra as exc:
            print(f"tfscache simulate: {exc}", file=sys.stderr)
            return 2
    if args.load:
        try:
            rules = loadreport.parse_rules(args.copies)
        except ValueError as e:
            parser.error(f"--copies: {e}")
        if args.concurrency < 1 or args.service_ms < 0:
            parser.error("--concurrency must be at least 1 and --service-ms not negative")
    if args.tiers and not (
        args.promote_ratio >= 0 and args.host_slowdown >= 0 and args.promote_horizon_s > 0
    ):
        parser.error("--promote-ratio and --host-slowdown must not be negative, "
                     "--promote-horizon-s must be above 0")
    started = time.perf_counter()
    try:
        trace = read_trace(args.log)
    except TraceError as e:
        print(f"tfscache simulate: {e}", file=sys.stderr)
        return 2
    if args.load:
        return _load(args, trace, rules, started)
    if args.prefetch:
        return _prefetch(args, trace, started)
    if args.tiers:
        return _tiers(args, trace, started)
    configs = [
        Config(policy, nodes, max_models, memory)
        for nodes, max_models, memory in itertools.product(args.nodes, args.max_models, args.memory)
        for policy in [*args.policies, BELADY]
    ]
    from tqdm import tqdm

    with tqdm(
        total=len(trace) * len(configs),
        unit="req",
        unit_scale=True,
        file=sys.stderr,
        leave=False,
        disable=bar_disable(args),
    ) as bar:
        results = simulate(trace, configs, build_policy, progress=bar.update)
    bounds = _bounds(trace, configs, args.bound_max_requests, args.quiet)
    wall = time.perf_counter() - started
    if args.plot is not None:
        from tfscache.sim.report import plot

        try:
            plot(results, args.plot)
        except OSError as e:
            print(f"tfscache simulate: cannot write the plot {args.plot}: {e}", file=sys.stderr)
            return 2
    from tfscache.sim import report

    if args.json:
        json.dump(
            report.document(results, str(args.log), len(trace), len(trace.models), wall, bounds),
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(report.table(results, bounds))
    if not args.quiet:
        print(
            f"{len(configs)} configurations of {len(trace)} requests for {len(trace.models)} models "
            f"simulated in {wall:.1f} s",
            file=sys.stderr,
        )
    log.debug("simulated %s configurations in %.3f s", len(configs), wall)
    return 0


def _load(args, trace, rules, started: float) -> int:
    """``--load``: every configuration with copies off and on, one table (or JSON)."""
    configs = loadreport.configs(
        args.policies,
        args.nodes,
        args.max_models,
        concurrency=args.concurrency,
        service_s=args.service_ms / 1000,
        rules=rules,
    )
    results = [run_load(trace, config, build_policy) for config in configs]
    wall = time.perf_counter() - started
    if args.json:
        json.dump(
            {
                "log": str(args.log),
                "requests": len(trace),
                "models": len(trace.models),
                "wall_seconds": round(wall, 3),
                "results": [r.as_dict() for r in results],
            },
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(loadreport.table(results))
    if not args.quiet:
        print(
            f"{len(configs)} configurations of {len(trace)} requests for {len(trace.models)} models "
            f"simulated under load in {wall:.1f} s",
            file=sys.stderr,
        )
    return 0


def _tiers(args, trace, started: float) -> int:
    """``--tiers``: every combination with demotion off and on, one table (or JSON)."""
    from tfscache.sim.tiers import TierConfig, simulate_tiers, table

    configs = [
        TierConfig(policy, nodes, demote, gpu_models=max_models, gpu_bytes=gpu,
                   host_models=args.host_models, host_bytes=host,
                   promote_ratio=args.promote_ratio, host_slowdown=args.host_slowdown,
                   service_s=args.service_ms / 1000, horizon_s=args.promote_horizon_s)
        for policy in args.policies
        for nodes, max_models, gpu, host in itertools.product(
            args.nodes, args.max_models, args.gpu_memory, args.host_memory)
        for demote in ("none", "host")
    ]
    results = simulate_tiers(trace, configs, build_policy)
    wall = time.perf_counter() - started
    if args.json:
        json.dump({"log": str(args.log), "requests": len(trace), "models": len(trace.models),
                   "wall_seconds": round(wall, 3), "results": [r.as_dict() for r in results]},
                  sys.stdout, indent=1)
        print()
    else:
        print(table(results))
    if not args.quiet:
        print(f"{len(configs)} tier configurations of {len(trace)} requests for "
              f"{len(trace.models)} models simulated in {wall:.1f} s", file=sys.stderr)
    return 0


def _prefetch(args, trace, started: float) -> int:
    """``--prefetch``: every combination with prefetch off and on, one table (or JSON)."""
    from tfscache.cache.prefetch import CoAccessSettings
    from tfscache.settings import CacheSection
    from tfscache.sim.prefetch import PrefetchConfig, simulate_prefetch, table

    defaults = CacheSection()
    given = {
        "prefetch_window_s": args.prefetch_window_s,
        "prefetch_confidence": args.prefetch_confidence,
        "prefetch_min_support": args.prefetch_min_support,
    }
    try:
        learner = CoAccessSettings.from_section(dataclasses.replace(
            defaults, **{k: v for k, v in given.items() if v is not None}))
    except ValueError as e:
        print(f"tfscache simulate: --prefetch: {e}", file=sys.stderr)
        return 2
    configs = [
        PrefetchConfig(policy, nodes, max_models, memory, on)
        for nodes, max_models, memory in itertools.product(args.nodes, args.max_models, args.memory)
        for policy in args.policies
        for on in (None, learner)
    ]
    results = simulate_prefetch(trace, configs, build_policy, args.follow_ms / 1000)
    wall = time.perf_counter() - started
    if args.json:
        json.dump(
            {
                "log": str(args.log),
                "requests": len(trace),
                "models": len(trace.models),
                "wall_seconds": round(wall, 3),
                "results": [r.as_dict() for r in results],
            },
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(table(results))
    if not args.quiet:
        print(
            f"{len(configs)} configurations of {len(trace)} requests replayed with prefetch off and on "
            f"in {wall:.1f} s",
            file=sys.stderr,
        )
    return 0


def _bounds(
    trace, configs: list[Config], limit: int, quiet: bool
) -> dict[tuple[int, int, int], Bound]:
    """The offline bound of each (nodes, max_models, memory_bytes), or none past ``limit`` requests."""
    if not limit:
        return {}
    if len(trace) > limit:
        print(f"tfscache simulate: no offline bound: the log has {len(trace)} requests, more than "
              f"--bound-max-requests {limit} (the bound is a linear program over every request; "
              f"replay a shorter log or raise the limit)", file=sys.stderr)
        return {}
    try:
        import scipy  # noqa: F401  (the solver: the [sim] extra)
    except ImportError:
        print(
            "tfscache simulate: no offline bound: it needs SciPy (pip install 'tfscache[sim]')",
            file=sys.stderr,
        )
        return {}
    groups = list(dict.fromkeys((c.nodes, c.max_models, c.memory_bytes) for c in configs))
    if not quiet:
        print(
            f"solving the offline bound for {len(groups)} combination{'s' if len(groups) != 1 else ''} "
            f"of node count and caps",
            file=sys.stderr,
        )
    splits = {nodes: split(trace, nodes) for nodes in {g[0] for g in groups}}
    return {g: cluster_bound(splits[g[0]], g[1], g[2]) for g in groups}
