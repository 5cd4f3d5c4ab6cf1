"""tfscache plan-resize (tfscache.cli.plan_resize): which models change nodes when the sidecar membership changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tfscache.cluster.ring import Ring
from tfscache.settings import RingSection

from tfscache.cli import plan_resize

VNODES = RingSection().vnodes
MODELS = [plan_resize.Model(f"tenant-{i:04d}", 1_000_000 + 7919 * i) for i in range(2000)]


def make_plan(current: str, new: str, replicas: int = 1):
    return plan_resize.plan(MODELS, current.split(","), new.split(","), replicas=replicas, vnodes=VNODES)


def serve_ring(names: str, replicas: int) -> Ring:
    # As tfscache serve builds it in sidecar mode: keyed by a dict of backends, own name first.
    return Ring({name: object() for name in names.split(",")}, replicas=replicas, vnodes=VNODES)


def test_adding_a_fourth_node_moves_about_a_quarter_to_it():
    p = make_plan("a,b,c", "a,b,c,d")
    # Consistent hashing moves ~1/4 (the new node's share); modulo hashing would move ~3/4.
    assert 0.18 * len(MODELS) < p.moving_models < 0.32 * len(MODELS)
    assert {dst for _, dst in p.flows} == {"d"}
    assert {src for src, _ in p.flows} == {"a", "b", "c"}  # each old node gives some up
    nodes = p.per_node()
    assert nodes["d"]["models_in"] == p.moving_models and nodes["d"]["models_out"] == 0


def test_adding_a_node_with_two_replicas_moves_copies_only_to_it():
    p = make_plan("a,b,c", "a,b,c,d", replicas=2)
    # d takes ~2/4 of the 2 x 2,000 replica slots: ~1,000 copies, at most one per model.
    assert 0.4 * len(MODELS) < p.copies.models < 0.6 * len(MODELS)
    assert p.copies.models == p.moving_models
    assert {dst for _, dst in p.flows} == {"d"}


@pytest.mark.parametrize("replicas", [1, 2])
def test_removing_a_node_moves_only_its_models(replicas):
    p = make_plan("a,b,c,d", "a,b,d", replicas=replicas)
    before = serve_ring("a,b,c,d", replicas)
    held_by_c = {m.name for m in MODELS if "c" in before.replicas_for(m.name)}
    assert {m["name"] for m in p.moved} == held_by_c
    assert {src for src, _ in p.flows} == {"c"}
    assert p.per_node()["c"]["models_out"] == len(held_by_c)


def test_moves_match_the_ring_serve_builds():
    p = make_plan("a,b,c", "a,c,d,e", replicas=2)
    before, after = serve_ring("a,b,c", 2), serve_ring("a,c,d,e", 2)
    changed = {m.name for m in MODELS if set(before.replicas_for(m.name)) != set(after.replicas_for(m.name))}
    assert {m["name"] for m in p.moved} == changed
    for m in p.moved:
        assert m["from"] == list(before.replicas_for(m["name"])) and m["to"] == list(after.replicas_for(m["name"]))


@pytest.mark.parametrize("current, new, replicas", [("a,b,c", "a,b,c,d", 1), ("a,b,c", "a,b,c,d", 2),
                                                    ("a,b,c,d", "a,b", 2), ("a", "a,b,c", 3)])
def test_bytes_add_up(current, new, replicas):
    p = make_plan(current, new, replicas)
    sizes = {m.name: m.bytes for m in MODELS}
    assert p.bytes == sum(sizes.values()) and p.models == len(MODELS)
    assert p.moving_bytes == sum(sizes[m["name"]] for m in p.moved)
    copies = sum(sizes[m["name"]] * max(len(set(m["from"]) - set(m["to"])), len(set(m["to"]) - set(m["from"])))
                 for m in p.moved)
    assert p.copies.bytes == copies == sum(f.bytes for f in p.flows.values())
    nodes = p.per_node().values()
    from_nowhere = sum(f.bytes for (src, _), f in p.flows.items() if src == plan_resize.NONE)
    to_nowhere = sum(f.bytes for (_, dst), f in p.flows.items() if dst == plan_resize.NONE)
    assert sum(n["bytes_out"] for n in nodes) + from_nowhere == p.copies.bytes
    assert sum(n["bytes_in"] for n in nodes) + to_nowhere == p.copies.bytes


def test_growing_past_the_replica_count_creates_copies_from_nowhere():
    # With 1 node and 3 replicas a model has one replica; on 3 nodes it gains two.
    p = make_plan("a", "a,b,c", replicas=3)
    assert p.moving_models == len(MODELS)
    assert p.copies.models == 2 * len(MODELS)
    assert {src for src, _ in p.flows} == {plan_resize.NONE}


def test_unchanged_membership_moves_nothing():
    p = make_plan("a,b,c", "c,b,a", replicas=2)
    assert p.moved == [] and p.flows == {} and p.copies.bytes == 0


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfscache", "plan-resize", *args], capture_output=True, text=True,
                          timeout=60)


def test_json_output_parses_and_matches(tmp_path):
    models_file = tmp_path / "models.txt"
    models_file.write_text("# name size\n" + "".join(f"{m.name} {m.bytes}\n" for m in MODELS[:500]))
    result = run("--current", "a,b,c", "--new", "a,b,c,d", "--models-file", str(models_file), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    expected = plan_resize.plan(MODELS[:500], ["a", "b", "c"], ["a", "b", "c", "d"], replicas=1, vnodes=VNODES)
    assert data == json.loads(json.dumps(expected.to_json()))
    assert data["moving_models"] == len(data["moved"]) and data["models"] == 500
    assert sum(f["bytes"] for f in data["flows"]) == data["moving_copy_bytes"]


def test_text_output_has_flows_nodes_and_totals(tmp_path):
    models_file = tmp_path / "models.txt"
    models_file.write_text("m1 4GiB\nm2 512MiB\nm3 1000\n")
    result = run("--current", "a,b", "--new", "a", "--models-file", str(models_file), "--list")
    assert result.returncode == 0, result.stderr
    p = plan_resize.plan(plan_resize.read_models_file(models_file), ["a", "b"], ["a"], replicas=1, vnodes=VNODES)
    assert p.moving_models > 0  # b held some of the three
    assert f"models moving: {p.moving_models} of 3" in result.stdout
    flow_rows = [line.split() for line in result.stdout.splitlines() if line.startswith("b ")]
    assert flow_rows[0][:4] == ["b", "a", str(p.copies.models), f"{p.copies.bytes:,}"]  # from, to, models, bytes
    for m in p.moved:
        assert f"{m['name']}\t{m['bytes']}\tb -> a" in result.stdout


def make_repository(root: Path) -> dict[str, int]:
    """Models with files of known sizes; returns name -> size of its newest version."""
    sizes = {}
    for i in range(30):
        name = f"model-{i}"
        for version, size in ((1, 100 + i), (10, 1000 + i)):  # 10 is newest (numeric, not lexical)
            vdir = root / name / str(version)
            (vdir / "variables").mkdir(parents=True)
            (vdir / "saved_model.pb").write_bytes(b"x" * size)
            (vdir / "variables" / "variables.data-00000-of-00001").write_bytes(b"y" * i)
        sizes[name] = 1000 + i + i
    (root / "no-versions" / "assets").mkdir(parents=True)  # not a servable model
    (root / "README").write_text("not a model")
    return sizes


def test_repository_scan_uses_the_newest_versions_size(tmp_path):
    sizes = make_repository(tmp_path)
    models = plan_resize.scan_repository(tmp_path, progress=False)
    assert {m.name: m.bytes for m in models} == sizes


def test_repository_scan_shows_a_progress_bar(tmp_path, capsys):
    make_repository(tmp_path)
    plan_resize.scan_repository(tmp_path, progress=True)
    assert "scanning" in capsys.readouterr().err


def test_cli_over_a_repository(tmp_path):
    sizes = make_repository(tmp_path)
    result = run("--current", "a,b,c", "--new", "a,b", "--model-repository", str(tmp_path), "--json",
                 "--replicas", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # not a terminal: no progress bar
    data = json.loads(result.stdout)
    assert data["models"] == len(sizes) and data["bytes"] == sum(sizes.values())
    assert {m["name"] for m in data["moved"]} == {n for n in sizes if "c" in serve_ring("a,b,c", 2).replicas_for(n)}


@pytest.mark.parametrize("args, content, message", [
    (["--current", "a,b", "--new", "a,a"], "m 1\n", "unique"),
    (["--current", "", "--new", "a"], "m 1\n", "no node names"),
    (["--current", "a", "--new", "b", "--replicas", "0"], "m 1\n", "argument --replicas: '0': must be > 0"),
    (["--current", "a", "--new", "b"], "m\n", "expected 'NAME SIZE'"),
    (["--current", "a", "--new", "b"], "m 4XB\n", "bad size"),
    (["--current", "a", "--new", "b"], "m 1\nm 2\n", "listed twice"),
])
def test_bad_input_exits_2(tmp_path, args, content, message):
    models_file = tmp_path / "models.txt"
    models_file.write_text(content)
    result = run(*args, "--models-file", str(models_file))
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_missing_repository_exits_2(tmp_path):
    result = run("--current", "a", "--new", "b", "--model-repository", str(tmp_path / "nope"))
    assert result.returncode == 2 and "cannot list model repository" in result.stderr
