#!/usr/bin/env python
"""Durable acknowledgements soak: pin or unpin through the admin API, SIGKILL ``tfscache serve``
as soon as the reply is read, restart it over the same state directory, check every pin.

    .venv/bin/python scripts/soak_durable_acks.py [--rounds 50] [--models 6] [--json out.json]

Builds ``addk_1 .. addk_M`` into a temporary repository, starts one ``tfscache node`` and runs
the rounds of tests/admin/sigkill_rounds.py (the suite's tests/admin/test_durable_acks.py runs
five of them): round R pins model R mod M if it is not pinned, else unpins it, so with 6 models
and 50 rounds there are 26 pins and 24 unpins. Prints the rounds, the acknowledgements lost
(must be 0), how soon after the reply the SIGKILL went (median, max) and the round time (median,
p99: start of serve, re-adoption, one admin call). Exit status 1 if any acknowledgement was lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from admin.sigkill_rounds import sigkill_rounds
    from support.node import start_node
    from support.models import tfserving as testmodels

    with tempfile.TemporaryDirectory(prefix="soak-durable-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        repository.mkdir()
        models = []
        for k in range(1, args.models + 1):
            testmodels.build_addk(repository, k)
            models.append(f"addk_{k}")
        flags = ["--max_num_load_retries=0", "--num_load_threads=2"]
        with start_node(work / "node", config="model_config_list {\n}\n", flags=flags) as node:
            (work / "rounds").mkdir()
            result = sigkill_rounds(node, repository, work / "rounds", models, args.rounds)
    figures = {
        "rounds": result.rounds, "pins": result.pins, "unpins": result.unpins, "lost": len(result.lost),
        "lost_examples": result.lost[:5],
        "kill_after_reply_ms_median": round(statistics.median(result.kill_delays) * 1000, 3),
        "kill_after_reply_ms_max": round(max(result.kill_delays) * 1000, 3),
        "round_s_median": round(statistics.median(result.round_s), 3),
        "round_s_p99": round(quantile(result.round_s, 0.99), 3),
    }
    print(json.dumps(figures), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 1 if result.lost else 0


if __name__ == "__main__":
    sys.exit(main())
