"""`tfscache status` alone: rendering a /status document, and a server that cannot be read."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from support.node import PYTHON, REPO
from tfscache import cli
from tfscache.cli import status

DOC = {
    "time": 1000.0, "hits": 3, "misses": 1, "hit_ratio": 0.75,
    "ring": {"nodes": ["a", "b"], "replicas": 1},
    "nodes": [
        {"name": "a", "kind": "node", "address": "127.0.0.1:9000", "healthy": True, "resident_models": 1,
         "resident_bytes": 2 * 1024 * 1024, "leases": 1, "queue": [{"name": "z", "version": 1}],
         "model_states": {"loading": {"models": 1, "bytes": 1024 * 1024},
                          "available": {"models": 1, "bytes": 2 * 1024 * 1024},
                          "unloading": {"models": 0, "bytes": 0}},
         "caps": {"max_models": 3, "memory_bytes": 0},
         "models": [
             {"name": "m", "version": 2, "bytes": 2 * 1024 * 1024, "measured": True, "leases": 1,
              "last_use": 990.0, "state": "available"},
             {"name": "n", "version": 7, "bytes": 1024 * 1024, "measured": False, "leases": 0,
              "last_use": 400.0, "state": "loading"}]},
        {"name": "b", "kind": "peer", "address": "10.0.0.2:8500", "healthy": False},
    ],
}


def test_render_lists_nodes_models_and_the_hit_ratio():
    text = status.render(DOC)
    lines = text.splitlines()
    assert lines[0] == "nodes (ring: 2 node(s), 1 replica(s) per model)"
    assert lines[1].split() == ["NODE", "KIND", "ADDRESS", "HEALTHY", "AVAILABLE", "LOADING", "UNLOADING", "CAP",
                                "BYTES", "LEASES", "QUEUED", "UNLOADS/MIN"]
    # DOC is from a serve before the scaling signal: no unloads_per_minute, no scale line
    assert lines[2].split() == ["a", "node", "127.0.0.1:9000", "yes", "1", "1", "0", "2/3", "2", "MiB", "1", "1",
                                "-"]
    assert lines[3].split() == ["b", "peer", "10.0.0.2:8500", "NO", "-", "-", "-", "-", "-", "-", "-", "-"]
    assert not any(line.startswith("scale advice") for line in lines)
    assert "model versions (2)" in lines
    model_rows = [line.split() for line in lines[lines.index("model versions (2)"):] if line.startswith("  a  ")]
    assert model_rows == [["a", "m", "2", "available", "-", "2", "MiB", "10.0", "s", "ago", "1"],
                          ["a", "n", "7", "loading", "-", "1", "MiB", "(estimated)", "10", "min", "ago",
                           "0"]]  # "-": DOC is from a serve older than the tiers
    assert lines[-1] == "hit ratio: 75.0% (3 hits, 1 miss)"


@pytest.mark.parametrize("advice, words", [(1, "+1 (more nodes)"), (0, "0 (hold)"), (-1, "-1 (fewer nodes)")])
def test_render_shows_the_unload_rate_and_the_scale_advice(advice, words):
    node = {**DOC["nodes"][0], "unloads_per_minute": 12.25}
    doc = {**DOC, "nodes": [node],
           "scale": {"advice": advice, "reason": "why", "window_s": 300.0, "unloads_per_minute": {"a": 12.25}}}
    lines = status.render(doc).splitlines()
    assert next(line.split() for line in lines if line.startswith("  a "))[-1] == "12.2"
    assert f"scale advice: {words}: why (capacity unloads per minute over 300 s)" in lines
    assert lines[-1] == "hit ratio: 75.0% (3 hits, 1 miss)"


def test_render_before_any_request():
    doc = {**DOC, "hits": 0, "misses": 0, "hit_ratio": None,
           "nodes": [{**DOC["nodes"][0], "models": [], "resident_models": 0, "resident_bytes": 0,
                      "leases": 0, "queue": [], "model_states": EMPTY}]}
    text = status.render(doc)
    assert "model versions (0)\n  none" in text
    assert text.endswith("hit ratio: n/a (no requests yet) (0 hits, 0 misses)")


EMPTY = {state: {"models": 0, "bytes": 0} for state in ("loading", "available", "unloading")}
MiB = 1024 * 1024


def states(loading=0, available=0, unloading=0, mib=1):
    return {"loading": {"models": loading, "bytes": loading * mib * MiB},
            "available": {"models": available, "bytes": available * mib * MiB},
            "unloading": {"models": unloading, "bytes": unloading * mib * MiB}}


@pytest.mark.parametrize("model_states, caps, cell", [
    (states(1, 2, 2), {"max_models": 3, "memory_bytes": 0}, "3/3"),  # capped at 3, 5 in the config: held
    (states(1, 3, 0), {"max_models": 3, "memory_bytes": 0}, "4/3 over"),
    (states(0, 2, 1), {"max_models": 0, "memory_bytes": 4 * MiB}, "2 MiB/4 MiB"),
    (states(1, 2, 0, mib=2), {"max_models": 4, "memory_bytes": 4 * MiB}, "3/4 6 MiB/4 MiB over"),
    (states(0, 7, 0), {"max_models": 0, "memory_bytes": 0}, "none"),
    (states(0, 0, 0), None, "-"),  # the node is down
])
def test_cap_counts_loading_and_available(model_states, caps, cell):
    assert status.cap_text({"model_states": model_states, "caps": caps}) == cell


def test_a_node_capped_at_three_reads_its_states_apart():
    node = {**DOC["nodes"][0], "model_states": states(1, 2, 2), "resident_models": 2}
    row = next(line.split() for line in status.render({**DOC, "nodes": [node]}).splitlines()
               if line.startswith("  a "))
    assert row[4:8] == ["2", "1", "2", "3/3"]


def test_render_a_document_from_an_older_serve():
    """Without model_states and caps (before issue 10), resident_models counted every state."""
    old = {k: v for k, v in DOC["nodes"][0].items() if k not in ("model_states", "caps")}
    row = next(line.split() for line in status.render({**DOC, "nodes": [old]}).splitlines()
               if line.startswith("  a "))
    assert row[4:8] == ["1", "?", "?", "-"]


def test_status_is_a_tfscache_command():
    assert cli.COMMANDS["status"][0] == "tfscache.cli.status"


def test_status_cannot_reach_a_server():
    done = subprocess.run([PYTHON, "-m", "tfscache", "status", "--address", "127.0.0.1:1", "--timeout", "5"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1 and done.stdout == ""
    assert "tfscache status: cannot read http://127.0.0.1:1/status" in done.stderr


def test_json_round_trips_the_document(monkeypatch, capsys):
    monkeypatch.setattr(status, "fetch", lambda address, timeout, token="": DOC)
    assert status.main(["--address", "h:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DOC


def test_render_shows_each_models_copies():
    doc = {**DOC, "copies": {"min": 1, "max": 4, "models": {"m": ["a", "b"], "hot": ["b", "a", "c"]}}}
    lines = status.render(doc).splitlines()
    start = lines.index("model copies (copies follow load: 1 to 4 per model)")
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1:start + 5]]
    assert cells == [["MODEL", "COPIES", "COPIES ON", "RESIDENT ON"], ["hot", "3", "b, a, c", "-"],
                     ["m", "2", "a, b", "a"], ["n", "1", "-", "a"]]


def test_render_copies_of_a_serve_with_fixed_replicas():
    lines = status.render(DOC).splitlines()
    start = lines.index("model copies (fixed replicas)")
    assert [line.split() for line in lines[start + 2:start + 4]] == [["m", "1", "-", "a"], ["n", "1", "-", "a"]]


def test_render_lists_the_workers_of_a_serve_with_several():
    doc = {**DOC, "workers": [{"id": 0, "pid": 4001, "in_flight": 2, "restarts": 0, "delegations": 3,
                               "requests": 1200},
                              {"id": 1, "pid": 4107, "in_flight": 1, "restarts": 2, "delegations": 0}]}
    lines = status.render(doc).splitlines()
    at = lines.index("workers (2, 3 requests in flight)")
    assert lines[at - 1] == "" and lines[at - 2].split()[0] == "b"  # right after the nodes
    assert [line.split() for line in lines[at + 1:at + 4]] == [
        ["WORKER", "PID", "IN", "FLIGHT", "RESTARTS", "DELEGATIONS", "REQUESTS"], ["0", "4001", "2", "0", "3", "1200"],
        ["1", "4107", "1", "2", "0", "-"]]  # a serve that reports no requests per worker: "-"
    assert lines[-1] == "hit ratio: 75.0% (3 hits, 1 miss)"


def test_render_with_one_process_has_no_workers_section():
    assert status.render(DOC) == status.render({**DOC, "workers": []})
    assert "workers" not in status.render(DOC)


def test_render_shows_each_versions_tier_and_a_move():
    node = {**DOC["nodes"][0], "models": [
        {**DOC["nodes"][0]["models"][0], "tier": "gpu", "moving": ""},
        {**DOC["nodes"][0]["models"][1], "state": "available", "tier": "gpu", "moving": "host"}]}
    lines = status.render({**DOC, "nodes": [node]}).splitlines()
    assert lines[lines.index("model versions (2)") + 1].split()[:5] == [
        "NODE", "MODEL", "VERSION", "STATE", "TIER"]
    models = lines[lines.index("model versions (2)"):]
    rows = [line.split()[:5] for line in models if line.startswith("  a  ")]
    assert rows == [["a", "m", "2", "available", "gpu"], ["a", "n", "7", "available", "gpu->host"]]


def test_render_marks_a_host_tier_node():
    nodes = [{**DOC["nodes"][0], "tier": "gpu"}, {**DOC["nodes"][0], "name": "h", "tier": "host"}]
    lines = status.render({**DOC, "nodes": nodes}).splitlines()
    kinds = {line.split()[0]: line.split()[1] for line in lines[2:4]}
    assert kinds == {"a": "node", "h": "node/host"}
