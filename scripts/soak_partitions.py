#!/usr/bin/env python
"""Partitions soak: a cluster of hosts as network namespaces under 16-client Zipf traffic.

    sudo .venv/bin/python scripts/soak_partitions.py [--backend etcd|dns|both] [--short]
        [--models 12] [--cap 8] [--deadline 10] [--json out.json] [--keep DIR]

Builds ``addk_1 .. addk_M`` (y = x + K) into a temporary repository, then for each discovery
backend starts hosts a, b, c (behind a user-space delay proxy), d, each a network namespace on a
private bridge (10.231.N.0/24, made here and removed on exit) with a ``tfscache node`` and its
sidecar, etcd and dnsmasq in a namespace of their own, and 16 clients in another
(tests/support/netns). Then, in order, under traffic:

a) d's link down for 20 s, then up;  b) b killed whole (every process at once), then restarted
on its state;  c) c slowed by 500 ms each way for 20 s;  d) etcd and DNS unreachable for 30 s;
e) a new host e joins, and d is drained and leaves.

``--short`` uses the CI durations (4 s cut, 5 s outage, 4 s slow, 300 ms). Per scenario it prints
(and writes with ``--json``) the figures of tests/support/netns/scenarios.Figures: failed
requests by code with examples, requests that waited over 1 s, latency p50/p99/max, the most
copies of a model and how long any model was on more hosts than its replicas, the most models
on one host against the cap, time to converge after healing, whether pins were kept. Needs
root and ``ip netns``; exits 2 with the reason otherwise. Exit status 1 when a request failed
without naming the unreachable host, a cap was exceeded, or a pin was lost.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.netns import unavailable


def build_models(directory: Path, count: int) -> list[str]:
    from support.models import tfserving as testmodels

    for k in range(1, count + 1):
        if not (directory / f"addk_{k}").exists():
            testmodels.build_addk(directory, k)
    return [f"addk_{k}" for k in range(1, count + 1)]


def run_backend(backend: str, work: Path, repo: Path, models: list[str], args) -> list[dict]:
    from support.netns.cluster import NetCluster
    from support.netns.scenarios import CI, SOAK, Scenarios

    durations = CI if args.short else SOAK
    shutil.rmtree(work / backend, ignore_errors=True)  # a kept directory from an earlier run: fresh state
    figures = []
    with NetCluster(work / backend, repo, models, backend=backend, cap=args.cap) as cluster:
        run = Scenarios(cluster, durations, deadline=args.deadline)
        try:
            started = time.monotonic()
            run.setup()
            print(f"[{backend}] cluster up in {time.monotonic() - started:.0f} s", flush=True)
            for scenario in (run.cut_off, run.kill_whole, run.slow_peer, run.discovery_down, run.join_and_drain):
                f = scenario()
                figures.append(f.as_dict())
                print(json.dumps(f.as_dict()), flush=True)
        finally:
            run.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["etcd", "dns", "both"], default="both")
    parser.add_argument("--short", action="store_true", help="the CI durations")
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--cap", type=int, default=8, help="max_models_per_node of every sidecar")
    parser.add_argument("--deadline", type=float, default=10.0, help="each request's deadline, seconds")
    parser.add_argument("--repo", type=Path, help="reuse this model repository (built if missing)")
    parser.add_argument("--keep", type=Path, help="work directory (logs) to keep")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # SIGTERM: clean up (namespaces, processes) first
    reason = unavailable()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-partitions-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        repo = args.repo or work / "models"
        repo.mkdir(parents=True, exist_ok=True)
        models = build_models(repo, args.models)
        results = []
        for backend in (["etcd", "dns"] if args.backend == "both" else [args.backend]):
            results += run_backend(backend, work, repo, models, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    bad = [f["scenario"] for f in results
           if f["failures_naming_host"] < sum(f["failed"].values()) or f["max_resident"] > f["cap"]
           or f["pins_kept"] is False]
    if bad:
        print(f"not met in: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
