"""The policy simulator: trace reading, the replay counted by hand, Belady as a bound, the CLI."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from tfscache.cluster.ring import Ring
from tfscache.sim import build_policy, policy_names
from tfscache.sim.engine import BELADY, Config, replay, replay_belady, simulate, split
from tfscache.sim.trace import Trace, TraceError, read_trace
from tfscache.cli.simulate import main, parse_bytes

ROOT = Path(__file__).resolve().parents[2]
HEADER = "time,model,version,load_seconds,bytes\n"
SIZES = {"A": 100, "B": 200, "C": 300, "D": 500}
LOADS = {"A": 1.0, "B": 2.0, "C": 4.0, "D": 8.0}


def _trace(models: str) -> Trace:
    """A one-letter-per-request trace, one request a second."""
    trace = Trace()
    index: dict[str, int] = {}
    for t, name in enumerate(models):
        if name not in index:
            index[name] = len(trace.models)
            trace.models.append((name, None))
        trace.keys.append(index[name])
        trace.times.append(float(t))
        trace.load_seconds.append(LOADS[name])
        trace.sizes.append(SIZES[name])
    return trace


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- the replay, counted by hand -----------------------------------------------------------

@pytest.mark.parametrize(("policy", "hits", "evictions", "load_seconds", "peak"), [
    # A B A C B A in a cache of two models:
    ("lru", 1, 3, 1 + 2 + 4 + 2 + 1, 500),  # C evicts B, B evicts A, A evicts C
    ("fifo", 2, 2, 1 + 2 + 4 + 1, 500),  # C evicts A (first in), B hits, A evicts B
    ("lfu", 1, 3, 1 + 2 + 4 + 2 + 1, 500),  # C evicts B (K 1); B: A and C tie at K 2, older A goes; A evicts C
    ("cost", 1, 3, 1 + 2 + 4 + 2 + 1, 500),  # H = 2 * uses * seconds: C evicts B (4, older than A's 4); B evicts A; A evicts B
    (BELADY, 2, 2, 1 + 2 + 4 + 1, 500),  # C evicts A (next use 5, B's 4); B hits; A evicts B or C (neither used again)
])
def test_counts_of_a_tiny_log(policy, hits, evictions, load_seconds, peak):
    [result] = simulate(_trace("ABACBA"), [Config(policy, 1, max_models=2)], build_policy)
    counts = result.counts
    assert (counts.requests, counts.hits, counts.evictions, counts.uncacheable) == (6, hits, evictions, 0)
    assert counts.load_seconds == pytest.approx(load_seconds)
    assert counts.peak_bytes == peak
    assert result.hit_ratio == pytest.approx(hits / 6)


def test_a_memory_cap_evicts_until_the_model_fits():
    [requests] = split(_trace("ABC"), 1)
    counts = replay(requests, build_policy("lru"), 0, 450)
    assert (counts.hits, counts.evictions, counts.peak_bytes) == (0, 2, 300)  # C (300) needs A and B gone


@pytest.mark.parametrize("policy", [*policy_names(), BELADY])
def test_a_model_bigger_than_the_memory_cap_is_a_miss_never_cached(policy):
    # D (500 bytes) never fits 450: it is refused without evicting A and B, and never loaded.
    [result] = simulate(_trace("ABDAB"), [Config(policy, 1, memory_bytes=450)], build_policy)
    counts = result.counts
    assert (counts.hits, counts.uncacheable, counts.evictions) == (2, 1, 0)
    assert counts.load_seconds == pytest.approx(3.0)
    assert counts.peak_bytes == 300


def test_no_cap_misses_only_the_first_request_of_each_model():
    [result] = simulate(_trace("ABACBAD"), [Config("lru", 1)], build_policy)
    assert (result.counts.hits, result.counts.evictions, result.counts.peak_bytes) == (3, 0, 1100)


def test_requests_go_to_the_home_node_on_tfscache_ring():
    rng = random.Random(3)
    trace = Trace()
    for i in range(500):
        key = rng.randrange(40)
        if key >= len(trace.models):
            key = len(trace.models)
            trace.models.append((f"model{key}", None))
        trace.keys.append(key)
        trace.times.append(float(i))
        trace.load_seconds.append(1.0)
        trace.sizes.append(1)
    ring = Ring(["node0", "node1", "node2"], replicas=1)
    per_node = split(trace, 3)
    assert sum(map(len, per_node)) == 500
    for n, requests in enumerate(per_node):
        assert requests  # 40 models over 3 nodes: each gets some
        assert {ring.owner(trace.models[k][0]) for k, *_ in requests} == {f"node{n}"}
        assert [t for _, t, *_ in requests] == sorted(t for _, t, *_ in requests)
    # Each request knows where its model is next requested (on the same node, so in its list).
    for requests in per_node:
        for position, (key, _, _, _, nxt) in enumerate(requests):
            later = [i for i, k in enumerate(trace.keys) if k == key and i > int(requests[position][1])]
            assert nxt == (later[0] if later else 500)


def _random_log(rng: random.Random, length: int, models: int) -> Trace:
    trace = Trace()
    trace.models = [(f"m{i}", None) for i in range(models)]
    weights = [1 / (rank + 1) for rank in range(models)]
    for t in range(length):
        key = rng.choices(range(models), weights)[0]
        trace.keys.append(key)
        trace.times.append(float(t))
        trace.load_seconds.append(0.5 + key % 3)
        trace.sizes.append(1000 * (1 + key % 4))
    return trace


@pytest.mark.parametrize("seed", range(4))
def test_belady_is_never_beaten_on_hits_under_a_count_cap(seed):
    rng = random.Random(seed)
    trace = _random_log(rng, 400, 25)
    configs = [Config(p, nodes, max_models=cap) for nodes in (1, 2) for cap in (2, 4, 7)
               for p in [*policy_names(), BELADY]]
    results = simulate(trace, configs, build_policy)
    best: dict[tuple[int, int], int] = {}
    for r in results:
        if r.config.policy == BELADY:
            best[(r.config.nodes, r.config.max_models)] = r.counts.hits
    for r in results:
        assert r.counts.hits <= best[(r.config.nodes, r.config.max_models)], r.config
    # The bound is not vacuous: some policy falls short of it.
    assert any(r.counts.hits < best[(r.config.nodes, r.config.max_models)] for r in results)


def test_belady_evicts_the_model_used_farthest_ahead():
    [requests] = split(_trace("ABCABC"), 1)
    counts = replay_belady(requests, 2, 0)
    # C evicts B (A is next used at 3, B at 4); A hits; B evicts A (never used again); C hits.
    assert (counts.hits, counts.evictions) == (2, 2)
    lru = replay(requests, build_policy("lru"), 2, 0)
    assert (lru.hits, lru.evictions) == (0, 4)  # LRU's worst case: each model leaves just before its use


# -- reading logs --------------------------------------------------------------------------

def test_csv_with_any_column_order_extra_columns_and_no_version(tmp_path):
    path = _write(tmp_path / "log.csv", "model,bytes,status,time,load_seconds\n"
                  "a,100,200,1.5,0.25\n\nb,2e3,200,2.0,1\na,100,500,2.5,0.25\n")
    trace = read_trace(path)
    assert trace.models == [("a", None), ("b", None)]
    assert (trace.keys, trace.times, trace.sizes, trace.load_seconds) == (
        [0, 1, 0], [1.5, 2.0, 2.5], [100, 2000, 100], [0.25, 1.0, 0.25])


def test_versions_are_distinct_models_and_out_of_order_logs_are_sorted(tmp_path):
    path = _write(tmp_path / "log.csv", HEADER + "3,a,1,1,10\n1,a,2,1,10\n2,a,,1,10\n1,a,1,1,10\n")
    trace = read_trace(path)
    assert trace.models == [("a", 1), ("a", 2), ("a", None)]
    assert trace.times == [1.0, 1.0, 2.0, 3.0]
    assert trace.keys == [1, 0, 2, 0]  # equal times keep their order in the file


def test_jsonl_with_iso_times(tmp_path):
    path = _write(tmp_path / "log.jsonl",
                  '{"time": "2026-01-01T00:00:00+00:00", "model": "a", "load_seconds": 2, "bytes": 5}\n'
                  '\n{"time": "2026-01-01T00:00:01+00:00", "model": "b", "version": 7, "load_seconds": 0.5,'
                  ' "bytes": 6, "extra": true}\n')
    trace = read_trace(path)
    assert trace.models == [("a", None), ("b", 7)]
    assert trace.times[1] - trace.times[0] == 1.0


def test_an_unknown_extension_is_sniffed(tmp_path):
    jsonl = _write(tmp_path / "log.txt", '{"time": 1, "model": "a", "load_seconds": 1, "bytes": 1}\n')
    csv = _write(tmp_path / "log2.txt", HEADER + "1,a,,1,1\n")
    assert len(read_trace(jsonl)) == len(read_trace(csv)) == 1


@pytest.mark.parametrize(("text", "error"), [
    ("time,model,bytes\n1,a,2\n", r":1: the header row lacks load_seconds"),
    (HEADER + "1,a,,1,10\n2,b,,1\n", r":3: 4 fields, but the header has 5"),
    (HEADER + "1,a,,1,10\nsoon,b,,1,10\n", r":3: time must be seconds or an ISO 8601 timestamp, got 'soon'"),
    (HEADER + "1,a,,slow,10\n", r":2: load_seconds must be a number, got 'slow'"),
    (HEADER + "1,a,,-1,10\n", r":2: load_seconds must not be negative"),
    (HEADER + "1,a,,nan,10\n", r":2: load_seconds must be finite"),
    (HEADER + "1,a,,1,-10\n", r":2: bytes must not be negative"),
    (HEADER + "1,a,,1,1.5\n", r":2: bytes must be a whole number, got '1.5'"),
    (HEADER + "1,a,v2,1,10\n", r":2: version must be a number, got 'v2'"),
    (HEADER + "1, ,,1,10\n", r":2: model must be a non-empty string"),
])
def test_csv_errors_name_the_line(tmp_path, text, error):
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(TraceError, match=error) as info:
        read_trace(path)
    assert str(info.value).startswith(f"{path}:")


@pytest.mark.parametrize(("text", "error"), [
    ('{"time": 1, "model": "a", "load_seconds": 1, "bytes": 1}\n{"time": 2,', r":2: not JSON"),
    ('[1, "a", 1, 1]\n', r":1: expected a JSON object, got list"),
    ('\n{"time": 1, "model": "a", "bytes": 1}\n', r":2: missing load_seconds"),
    ('{"time": 1, "model": "a", "load_seconds": null, "bytes": 1}\n', r":1: missing load_seconds"),
    ('{"time": 1, "model": 5, "load_seconds": 1, "bytes": 1}\n', r":1: model must be a non-empty string, got 5"),
    ('{"time": 1, "model": "a", "load_seconds": true, "bytes": 1}\n', r":1: load_seconds must be a number"),
    ('{"time": 1, "model": "a", "load_seconds": 1, "bytes": "lots"}\n', r":1: bytes must be a number, got 'lots'"),
])
def test_jsonl_errors_name_the_line(tmp_path, text, error):
    path = _write(tmp_path / "bad.jsonl", text)
    with pytest.raises(TraceError, match=error):
        read_trace(path)


def test_gzip_and_a_byte_order_mark(tmp_path):
    import gzip

    with gzip.open(tmp_path / "log.csv.gz", "wt", encoding="utf-8") as f:
        f.write("\ufeff" + HEADER + "1,a,,1,10\n2,b,,1,10\n")
    trace = read_trace(tmp_path / "log.csv.gz")
    assert trace.models == [("a", None), ("b", None)]


def test_a_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "none.csv")


# -- the command ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("1024", 1024), ("4KiB", 4096), ("1.5GiB", 3 * 2**29), ("2GB", 2 * 10**9),
    ("512mib", 512 * 2**20), ("3 M", 3 * 10**6), ("1TiB", 2**40),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "1.5 parsecs", "-1GiB", "1e3"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match="expected bytes"):
        parse_bytes(text)


def _small_log(tmp_path: Path) -> Path:
    rng = random.Random(11)
    lines = [HEADER]
    for t in range(300):
        key = min(int(rng.paretovariate(0.8)), 30)
        lines.append(f"{t},model{key},,{0.5 + key % 4},{(1 + key % 5) * 2**20}\n")
    return _write(tmp_path / "log.csv", "".join(lines))


def test_the_command_writes_a_plot_and_a_json_report(tmp_path, capsys):
    log = _small_log(tmp_path)
    png = tmp_path / "out" / "hits.png"
    png.parent.mkdir()
    rc = main([str(log), "--nodes", "1,2", "--max-models", "2,4,8", "--memory", "0,12MiB",
               "--plot", str(png), "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out)
    assert (report["requests"], report["log"]) == (300, str(log))
    results = report["results"]
    assert len(results) == 2 * 3 * 2 * 6  # nodes x max_models x memory x (5 policies + belady)
    assert {r["policy"] for r in results} == {"lru", "fifo", "lfu", "cost", "gdsf", BELADY}
    assert len(report["bounds"]) == 2 * 3 * 2  # one per node count and caps, each a lower bound of every row
    bounds = {(b["nodes"], b["max_models"], b["memory_bytes"]): b for b in report["bounds"]}
    for r in results:
        bound = bounds[(r["nodes"], r["max_models"], r["memory_bytes"])]
        assert bound["exact"] == (not r["memory_bytes"])
        assert r["load_vs_bound"] == pytest.approx(r["load_seconds"] / bound["load_seconds"])
        assert r["load_vs_bound"] >= 1 - 1e-9, r
    assert all(r["hits"] + r["misses"] == 300 for r in results)
    assert all(r["peak_bytes"] <= 12 * 2**20 for r in results if r["memory_bytes"])


def test_the_command_prints_a_table(tmp_path, capsys):
    log = _small_log(tmp_path)
    assert main([str(log), "--policies", "lru,cost", "--max-models", "3", "--memory", "8MiB"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["policy", "nodes", "max_models", "memory", "hit_ratio", "hits", "misses",
                                "load_s", "peak_mem", "evictions", "uncacheable", "vs_bound"]
    assert [line.split()[0] for line in lines[1:]] == ["lru", "cost", BELADY, "lp-bound"]
    assert lines[1].split()[1:4] == ["1", "3", "8"]  # "8 MiB" splits in two
    assert lines[4].split()[-1] == "1.000" and all(float(line.split()[-1]) >= 1.0 for line in lines[1:4])
    assert "3 configurations of 300 requests" in err  # summary line; no progress bar off a TTY


def test_the_plot_of_a_memory_axis(tmp_path, capsys):
    png = tmp_path / "mem.png"
    assert main([str(_small_log(tmp_path)), "--memory", "4MiB,8MiB,16MiB", "--plot", str(png), "--quiet"]) == 0
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "lru,mru"], "unknown policy 'mru'; known: cost, fifo, gdsf, lfu, lru"),
    (["--nodes", "0"], "--nodes: a node count must be at least 1"),
    (["--nodes", "two"], "bad node count 'two'"),
    (["--max-models", "-3"], "model count must not be negative"),
    (["--memory", "lots"], "bad size 'lots'"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main([str(_small_log(tmp_path)), *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_log_exits_2_naming_the_line(tmp_path, capsys):
    path = _write(tmp_path / "bad.csv", HEADER + "1,a,,1,10\n2,b,,1,ten\n")
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"tfscache simulate: {path}:3: bytes must be a number, got 'ten'\n"


def test_an_unwritable_plot_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:  # a missing directory: refused before simulating
        main([str(_small_log(tmp_path)), "--plot", str(tmp_path / "no" / "dir" / "x.png"), "--quiet"])
    out, err = capsys.readouterr()
    assert (info.value.code, out) == (2, "")
    assert "argument --plot: cannot write the plot" in err and "no directory" in err
    (tmp_path / "x.png").mkdir()  # a directory where the file should go: found only when writing
    assert main([str(_small_log(tmp_path)), "--plot", str(tmp_path / "x.png"), "--quiet"]) == 2
    assert "cannot write the plot" in capsys.readouterr().err


# -- the log generator ---------------------------------------------------------------------

def _generator():
    spec = importlib.util.spec_from_file_location("gen_zipf_log", ROOT / "scripts" / "gen_zipf_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generator_is_deterministic_zipf_and_readable(tmp_path):
    gen = _generator()
    args = ["--models", "50", "--requests", "5000", "--alpha", "1.0"]
    for name, seed in (("a.csv", 1), ("b.csv", 1), ("c.csv", 2), ("a.jsonl", 1)):
        assert gen.main([*args, "--seed", str(seed), "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()
    csv, jsonl = read_trace(tmp_path / "a.csv"), read_trace(tmp_path / "a.jsonl")
    assert (csv.models, csv.keys, csv.sizes, csv.load_seconds) == (jsonl.models, jsonl.keys, jsonl.sizes,
                                                                   jsonl.load_seconds)
    assert len(csv) == 5000 and len(csv.models) <= 50
    assert all(gen.MIN_BYTES <= size <= gen.MAX_BYTES for size in csv.sizes)
    counts = sorted((csv.keys.count(k) for k in range(len(csv.models))), reverse=True)
    # Zipf(1) over 50 models: the top model takes 1/H(50) = 22 % of requests, the 10th about 2 %.
    assert 0.19 < counts[0] / 5000 < 0.25
    assert 0.015 < counts[9] / 5000 < 0.03
    # Load times grow with size (and vary around it).
    per_model = {k: (s, c) for k, s, c in zip(csv.keys, csv.sizes, csv.load_seconds)}
    small = [c for s, c in per_model.values() if s < 50 * gen.MB]
    large = [c for s, c in per_model.values() if s > 300 * gen.MB]
    assert small and large and sum(small) / len(small) < sum(large) / len(large)



def test_the_generator_shifts_popularity_daily_and_writes_pipelines(tmp_path):
    gen = _generator()
    args = ["--models", "50", "--requests", "6000", "--seed", "3"]
    assert gen.main([*args, "--days", "3", "--out", str(tmp_path / "shift.csv")]) == 0
    shift = read_trace(tmp_path / "shift.csv")
    assert len(shift) == 6000 and 2 * 86_400 < shift.times[-1] < 3.5 * 86_400
    days = [[k for k, t in zip(shift.keys, shift.times) if int(t // 86_400) == d] for d in range(3)]
    tops = [max(set(day), key=day.count) for day in days]
    assert len(set(tops)) > 1  # each day has its own favourite (with 50 models, a repeat is unlikely)
    assert gen.main([*args, "--pipeline", "1", "--out", str(tmp_path / "pipe.csv")]) == 0
    pipe = read_trace(tmp_path / "pipe.csv")
    assert len(pipe) == 6000
    followers = {}
    for i in range(0, 6000, 2):  # every request is followed by its model's follower, 10 ms later
        assert pipe.times[i + 1] == pytest.approx(pipe.times[i] + 0.01)
        assert followers.setdefault(pipe.keys[i], pipe.keys[i + 1]) == pipe.keys[i + 1]
    with pytest.raises(SystemExit):
        gen.main([*args, "--pipeline", "1.5", "--out", str(tmp_path / "bad.csv")])

def test_the_tfscache_command_dispatches_to_the_simulator(tmp_path, capsys):
    from tfscache.cli import main as tfscache

    assert tfscache(["simulate", str(_small_log(tmp_path)), "--policies", "fifo", "--max-models", "4",
                     "--json", "--quiet"]) == 0
    assert [r["policy"] for r in json.loads(capsys.readouterr().out)["results"]] == ["fifo", BELADY]


def test_the_simulator_and_policies_never_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, tfscache.cli.simulate, tfscache.sim.report, tfscache.cache.policy.fifo, tfscache.cache.policy.lfu, "
            "tfscache.cache.policy.cost; sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_progress_reports_every_request_of_every_configuration(monkeypatch):
    import tfscache.sim.engine as engine

    monkeypatch.setattr(engine, "_CHUNK", 7)  # several chunks per node
    trace = _random_log(random.Random(5), 100, 12)
    reports: list[int] = []
    configs = [Config(p, 2, max_models=3) for p in ("lru", "cost", BELADY)]
    simulate(trace, configs, build_policy, progress=reports.append)
    assert sum(reports) == 3 * 100
    assert max(reports) == 7 and len(reports) > 3 * 2
