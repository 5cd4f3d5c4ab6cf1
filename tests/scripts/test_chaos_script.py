"""scripts/chaos.py: its bookkeeping (answers, peaks, errors lost with a killed front end)
and one short real run of the embedded scenario with a node killed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"
spec = importlib.util.spec_from_file_location("chaos", SCRIPT)
chaos = importlib.util.module_from_spec(spec)
sys.modules["chaos"] = chaos  # dataclasses look their module up there
spec.loader.exec_module(chaos)


def test_model_weights_zipf_and_uniform():
    assert chaos.model_weights(4, 0.0) == pytest.approx([0.25, 0.5, 0.75, 1.0])
    zipf = chaos.model_weights(3, 1.0)  # 1, 1/2, 1/3 over 11/6
    assert zipf == pytest.approx([6 / 11, 9 / 11, 1.0])


def _response(values):
    from tensorflow_serving.apis import predict_pb2

    response = predict_pb2.PredictResponse()
    response.outputs["y"].float_val.extend(values)
    return response


def test_check_counts_right_and_wrong_answers():
    results = chaos.Results(t0=0.0)
    x = np.float32(1.25)
    chaos.check(results, 3, x, _response([4.25]), start=1.0, elapsed=0.01)
    chaos.check(results, 3, x, _response([5.25]), start=2.0, elapsed=0.01)  # addk_4's answer
    chaos.check(results, 3, x, _response([4.25, 4.25]), start=3.0, elapsed=0.01)
    assert (results.requests, results.ok, results.latencies) == (3, 1, [0.01])
    assert results.wrong == [(2.0, "addk_3", 1.25, 4.25, [5.25]), (3.0, "addk_3", 1.25, 4.25, [4.25, 4.25])]


def test_peaks_take_the_maximum_of_each_state():
    peak = {}
    for loading, available, unloading in ((1, 2, 0), (0, 3, 1), (2, 1, 0)):
        chaos._peak(peak, {"model_states": {"loading": {"models": loading}, "available": {"models": available},
                                            "unloading": {"models": unloading}},
                           "caps": {"max_models": 3, "memory_bytes": 0}})
    chaos._peak(peak, {"model_states": {s: {"models": 0} for s in ("loading", "available", "unloading")},
                       "caps": None})  # node down: the cap seen before stays
    assert peak == {"available": 3, "loading+available": 3, "unloading": 1, "samples": 4, "cap": 3}


@pytest.mark.parametrize("error, lost", [
    ((9.0, 10.2, "UNAVAILABLE"), True),        # in flight at the kill
    ((10.3, 10.3, "UNAVAILABLE"), True),       # sent before the client saw the close
    ((10.5, 10.6, "UNAVAILABLE"), False),      # sent after: a real error
    ((8.0, 9.9, "UNAVAILABLE"), False),        # over before the kill
    ((9.0, 10.2, "NOT_FOUND"), False),         # not what a cut connection gives
])
def test_only_unavailable_in_flight_at_a_frontend_kill_is_lost(error, lost):
    assert chaos._lost_with_frontend((*error, "addk_1", "m"), [(10.0, 10.1)]) is lost


def test_summary_separates_lost_requests_and_fails_on_errors():
    results = chaos.Results(t0=0.0, requests=3, ok=1, latencies=[0.002],
                            errors=[(9.0, 10.2, "UNAVAILABLE", "addk_1", "Stream removed"),
                                    (20.0, 20.5, "NOT_FOUND", "addk_2", "Servable not found")],
                            frontend_kills=[(10.0, 10.1)])
    args = argparse.Namespace(duration=30.0, clients=2, models=5, uniform=False, alpha=1.0, cap=1,
                              kill_every=10.0)
    report = chaos.summarize("sidecar", results, args)
    assert (report["errors"], report["lost_with_killed_frontend"], report["failed"]) == (1, 1, True)
    assert report["errors_by_code"]["NOT_FOUND"]["example"] == "Servable not found"
    results.errors.pop()
    assert chaos.summarize("sidecar", results, args)["failed"] is False


def test_refuses_a_run_without_churn(capsys):
    with pytest.raises(SystemExit) as exc:
        chaos.main(["--scenario", "embedded", "--models", "8", "--cap", "4"])
    assert exc.value.code == 2
    assert "--models 8 fit in 2 node(s) x --cap 4: no churn" in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_run_with_a_node_killed(synthetic_models, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for base in synthetic_models(5):
        (repo / base.name).symlink_to(base, target_is_directory=True)
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--scenario", "embedded", "--duration", "6",
                          "--kill-every", "2", "--clients", "4", "--models", "5", "--cap", "1",
                          "--repo", str(repo), "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    report = json.loads(out.read_text())["reports"][0]
    assert report["errors"] == report["wrong_answers"] == 0 and report["ok"] == report["requests"] > 0
    assert any(text.startswith("SIGKILL node0") for _, text in report["events"])
    assert set(report["peaks"]) == {"node0", "node1"}
    assert all(p["loading+available"] <= p["cap"] == 1 for p in report["peaks"].values())
