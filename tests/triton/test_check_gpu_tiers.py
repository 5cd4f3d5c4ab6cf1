"""scripts/check_gpu_tiers.py, the GPU check of demotion within a Triton node (docs/tiers.md, "The
GPU check"), run end to end as ``--cpu-dry-run``: a real ``tfscache serve --backend triton`` over
the wheel's tritonserver, client threads through the official tritonclient, and the GPU stood in
for as in test_triton_tiers.py (instances that write files saying what they hold). What a GPU
would measure is not checked here: this machine has none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tfscache.kinds.gpumem import NvmlReader

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_gpu_tiers.py"
GiB = 1 << 30


def test_the_dry_run_demotes_and_promotes_under_traffic_with_no_request_failed(tmp_path):
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu-dry-run", "--bytes", "1GiB",
                           "--timeout", "50", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    assert done.stdout.startswith("CPU DRY RUN: no GPU here.")
    assert "PASSED (a dry run on CPU with a stand-in for GPU memory: not a GPU measurement)" in done.stdout
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["gpu_reading"] == "stand-in files"
    assert report["promotion_gated"] is False  # stand-in timings say nothing of a GPU's
    assert report["requests"]["failed"] == 0 and report["requests"]["failures"] == []
    assert report["requests"]["answered"] > 0
    totals = report["metrics"]["totals"]
    assert totals["tier_moves_total{to=host}"] >= 1
    assert totals["tier_moves_total{to=gpu}"] >= 1
    assert report["demoted"] and report["promoted"] and report["problems"] == []
    steps = {row["step"]: row for row in report["steps"]}
    # the stand-in reading, put to models by their stubs' command lines as NVML's would be
    assert steps["serve started"]["after"]["by_model"] == {}
    assert steps["cold load tier_1"]["after"]["by_model"] == {"tier_1": GiB}
    assert steps["cold load tier_2"]["after"]["by_model"] == {"tier_1": GiB, "tier_2": GiB}
    [promoted] = [row for row in report["steps"] if "room_made_by" in row]
    assert promoted["after"]["node_bytes"] <= report["cap_bytes"]
    assert {v["model"] for v in report["promotion_vs_cold_load"]} == set(
        m for m, values in report["metrics"]["models"].items()
        if values.get("tier_moves_total{to=gpu}"))


def test_without_a_gpu_the_check_says_it_cannot_run_here(tmp_path):
    if NvmlReader().available():
        pytest.skip("a GPU is here: run scripts/check_gpu_tiers.py itself")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "check.json")],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("check_gpu_tiers: cannot check here: no GPU to check: ")
    assert not (tmp_path / "check.json").exists()
