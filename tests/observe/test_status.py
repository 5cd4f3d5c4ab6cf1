"""`tfscache status` alone: rendering a /status document, and a server that cannot be read."""

from __future__ import annotations

import json
import subprocess

from support.node import PYTHON, REPO
from tfscache import cli, status

DOC = {
    "time": 1000.0, "hits": 3, "misses": 1, "hit_ratio": 0.75,
    "ring": {"nodes": ["a", "b"], "replicas": 1},
    "nodes": [
        {"name": "a", "kind": "node", "address": "127.0.0.1:9000", "healthy": True, "resident_models": 2,
         "resident_bytes": 3 * 1024 * 1024, "leases": 1, "queue": [{"name": "z", "version": 1}],
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
    assert lines[2].split() == ["a", "node", "127.0.0.1:9000", "yes", "2", "3.0", "MiB", "1", "1"]
    assert lines[3].split() == ["b", "peer", "10.0.0.2:8500", "NO", "-", "-", "-", "-"]
    assert "resident models (2)" in lines
    model_rows = [line.split() for line in lines[lines.index("resident models (2)"):] if line.startswith("  a  ")]
    assert model_rows == [["a", "m", "2", "available", "2.0", "MiB", "10.0", "s", "ago", "1"],
                          ["a", "n", "7", "loading", "1.0", "MiB", "(estimated)", "10", "min", "ago", "0"]]
    assert lines[-1] == "hit ratio: 75.0% (3 hits, 1 miss)"


def test_render_before_any_request():
    doc = {**DOC, "hits": 0, "misses": 0, "hit_ratio": None,
           "nodes": [{**DOC["nodes"][0], "models": [], "resident_models": 0, "resident_bytes": 0,
                      "leases": 0, "queue": []}]}
    text = status.render(doc)
    assert "resident models (0)\n  none" in text
    assert text.endswith("hit ratio: n/a (no requests yet) (0 hits, 0 misses)")


def test_status_is_a_tfscache_command():
    assert cli.COMMANDS["status"][0] == "tfscache.status"


def test_status_cannot_reach_a_server():
    done = subprocess.run([PYTHON, "-m", "tfscache", "status", "--address", "127.0.0.1:1", "--timeout", "5"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1 and done.stdout == ""
    assert "tfscache status: cannot read http://127.0.0.1:1/status" in done.stderr


def test_json_round_trips_the_document(monkeypatch, capsys):
    monkeypatch.setattr(status, "fetch", lambda address, timeout: DOC)
    assert status.main(["--address", "h:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DOC
