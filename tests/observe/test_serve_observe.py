"""Metrics, `tfscache status` and the load/unload/eviction log of a real `tfscache serve`.

One serve (one embedded `tfscache node`, at most 2 models resident, ``--log-json``,
metrics on a port picked at start) over addk_1..addk_3 and a corrupt model. Each test
scrapes /metrics over HTTP before and after what it does, and checks that the values
moved as they should; the tests run in file order on the same serve.
"""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest
import requests

from support.serving import add_broken_model, link_repository, start_serve
from support import fixtures
from support.node import PYTHON, REPO
from support.requests import predict_request

from .promtext import Scrape

CAP = 2


@pytest.fixture(scope="module")
def repo(synthetic_models, tmp_path_factory):
    return add_broken_model(link_repository(tmp_path_factory.mktemp("observe") / "models", synthetic_models([1, 2, 3])))


@pytest.fixture(scope="module")
def serve(repo, tmp_path_factory):
    with start_serve(tmp_path_factory.mktemp("serve"), repo, "--local-nodes", "1", "--max-models-per-node",
                     str(CAP), "--metrics-port", "0", "--log-json",
                     "--set", "cache.failure_backoff_s=0") as process:
        yield process


stub = fixtures.stub_on("serve")


def scrape(serve) -> Scrape:
    reply = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/plain")
    return Scrape(reply.text)


def predict(stub, name: str, x: float = 1.0) -> float:
    response = stub.Predict(predict_request(name, x), timeout=120)
    return response.outputs["y"].float_val[0]


def moved(before: Scrape, after: Scrape, name: str, **labels) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def test_a_cold_request_misses_and_loads_and_a_repeat_hits(serve, stub):
    before = scrape(serve)
    assert predict(stub, "addk_1") == 2.0
    cold = scrape(serve)
    assert moved(before, cold, "tfscache_cache_misses_total", node="node0") == 1
    assert moved(before, cold, "tfscache_cache_hits_total") == 0
    assert moved(before, cold, "tfscache_loads_total", node="node0") == 1
    assert moved(before, cold, "tfscache_load_duration_seconds_count", node="node0") == 1
    assert moved(before, cold, "tfscache_load_duration_seconds_sum") > 0
    assert moved(before, cold, "tfscache_requests_total", protocol="grpc", method="Predict", code="OK") == 1
    assert cold.value("tfscache_resident_models", node="node0") == 1
    assert cold.value("tfscache_resident_bytes", node="node0", kind="measured") > 0
    assert predict(stub, "addk_1") == 2.0
    warm = scrape(serve)
    assert moved(cold, warm, "tfscache_cache_hits_total", node="node0") == 1
    assert moved(cold, warm, "tfscache_cache_misses_total") == 0
    assert moved(cold, warm, "tfscache_loads_total") == 0
    assert moved(cold, warm, "tfscache_requests_total", protocol="grpc", method="Predict", code="OK") == 1


def test_node_ring_lease_and_queue_gauges(serve):
    s = scrape(serve)
    assert s.value("tfscache_node_healthy", node="node0") == 1
    assert s.value("tfscache_ring_nodes") == 1
    assert s.value("tfscache_leases_in_flight", node="node0") == 0  # no request in flight
    assert s.value("tfscache_load_queue_depth", node="node0") == 0


def test_exceeding_the_cap_evicts_for_capacity_and_resident_models_stay_at_the_cap(serve, stub):
    before = scrape(serve)
    for k in (2, 3, 1):  # addk_1 is resident: 2 fills the cap, 3 evicts 1, 1 evicts 2
        assert predict(stub, f"addk_{k}") == 1.0 + k
    after = scrape(serve)
    assert moved(before, after, "tfscache_evictions_total", node="node0", reason="capacity") == 2
    assert moved(before, after, "tfscache_unloads_total", node="node0") == 2
    assert moved(before, after, "tfscache_loads_total") == 3
    assert after.value("tfscache_resident_models", node="node0") == CAP


def test_a_corrupt_model_counts_a_load_failure(serve, stub):
    before = scrape(serve)
    with pytest.raises(grpc.RpcError) as caught:
        predict(stub, "broken")
    after = scrape(serve)
    code = caught.value.code().name
    assert code not in ("OK", "NOT_FOUND", "UNAVAILABLE"), caught.value.details()
    assert moved(before, after, "tfscache_load_failures_total", node="node0") == 1
    assert moved(before, after, "tfscache_loads_total", node="node0") == 1
    assert moved(before, after, "tfscache_load_duration_seconds_count") == 0
    # Its load was admitted under the cap like any other: the least recently used made room.
    assert moved(before, after, "tfscache_evictions_total", reason="capacity") == 1
    assert moved(before, after, "tfscache_requests_total", protocol="grpc", method="Predict", code=code) == 1


def test_requests_are_counted_by_code_on_both_transports(serve, stub):
    before = scrape(serve)
    with pytest.raises(grpc.RpcError) as caught:
        predict(stub, "no_such_model")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert requests.get(f"{serve.rest_url}/v1/models/addk_1", timeout=60).status_code == 200
    assert requests.get(f"{serve.rest_url}/v1/models/no_such_model", timeout=60).status_code == 404
    after = scrape(serve)
    assert moved(before, after, "tfscache_requests_total", protocol="grpc", method="Predict",
                 code="NOT_FOUND") == 1
    assert moved(before, after, "tfscache_requests_total", protocol="rest", method="GetModelStatus",
                 code="200") == 1
    assert moved(before, after, "tfscache_requests_total", protocol="rest", method="GetModelStatus",
                 code="404") == 1
    assert moved(before, after, "tfscache_requests_total", protocol="grpc", code="OK") == 0


def status_command(serve, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", "status", "--address", f"127.0.0.1:{serve.metrics_port}",
                           *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_status_json_matches_the_cache_and_the_metrics(serve, stub):
    # The corrupt model's load took addk_3's room: load it again, then use addk_1 last.
    assert predict(stub, "addk_3") == 4.0
    assert predict(stub, "addk_1") == 2.0
    done = status_command(serve, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    s = scrape(serve)
    assert doc["ring"] == {"nodes": ["node0"], "replicas": 1}
    (node,) = doc["nodes"]
    assert (node["name"], node["kind"], node["healthy"]) == ("node0", "node", True)
    assert node["address"].startswith("127.0.0.1:")
    models = {m["name"]: m for m in node["models"]}
    assert set(models) == {"addk_1", "addk_3"}
    assert node["resident_models"] == CAP == s.value("tfscache_resident_models", node="node0")
    assert node["model_states"]["available"]["models"] == CAP == s.value("tfscache_resident_models", node="node0",
                                                                          state="available")
    assert node["model_states"]["loading"]["models"] == node["model_states"]["unloading"]["models"] == 0
    assert node["caps"] == {"max_models": CAP, "memory_bytes": 0}
    assert s.value("tfscache_cap_models", node="node0") == CAP
    assert node["resident_bytes"] == sum(m["bytes"] for m in models.values()) > 0
    assert all(m["state"] == "available" and m["leases"] == 0 and m["version"] == 1 for m in models.values())
    assert models["addk_1"]["last_use"] > models["addk_3"]["last_use"]
    assert doc["time"] >= models["addk_1"]["last_use"]
    hits, misses = s.value("tfscache_cache_hits_total"), s.value("tfscache_cache_misses_total")
    assert (doc["hits"], doc["misses"]) == (hits, misses)
    assert doc["hit_ratio"] == pytest.approx(hits / (hits + misses))


def test_status_table(serve):
    doc = json.loads(status_command(serve, "--json").stdout)
    done = status_command(serve)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    node_row = next(line.split() for line in lines if line.strip().startswith("node0 "))
    assert node_row[:4] == ["node0", "node", doc["nodes"][0]["address"], "yes"]
    assert node_row[4:8] == ["2", "0", "0", f"2/{CAP}"]  # available, loading, unloading, cap
    rows = {line.split()[1]: line.split() for line in lines if line.strip().startswith("node0  addk_")}
    assert set(rows) == {"addk_1", "addk_3"}
    assert rows["addk_1"][2:4] == ["1", "available"] and "ago" in " ".join(rows["addk_1"])
    ratio = 100 * doc["hit_ratio"]
    assert f"hit ratio: {ratio:.1f}% ({doc['hits']} hit" in done.stdout


def serve_json_lines(serve) -> list[dict]:
    """The JSON log lines in the serve's log (the node child's among them)."""
    docs = []
    for line in serve.log_text().splitlines():
        if line.startswith("{"):
            docs.append(json.loads(line))
    return docs


def test_the_log_has_one_json_line_per_load_unload_and_eviction(serve):
    docs = serve_json_lines(serve)
    ours = [d for d in docs if d["logger"].startswith("tfscache.") and not d["logger"].startswith("tfscache.modelserver")]
    assert ours and all(set(d) >= {"time", "level", "logger", "message"} for d in ours)
    loaded = [d for d in ours if " loaded " in d["message"]]
    unloaded = [d for d in ours if " unloaded " in d["message"]]
    evicted = [d for d in ours if " evicting " in d["message"]]
    failed = [d for d in ours if " failed after " in d["message"]]
    # Loads: addk_1, 2, 3, 1 again, the corrupt model (failed), addk_3 again; each of the
    # last four needed the room of the least recently used.
    assert [(d["model"], d["version"]) for d in loaded] == [
        ("addk_1", 1), ("addk_2", 1), ("addk_3", 1), ("addk_1", 1), ("addk_3", 1)]
    assert [(d["model"], d["reason"]) for d in evicted] == [
        ("addk_1", "capacity"), ("addk_2", "capacity"), ("addk_3", "capacity")]
    assert [d["model"] for d in unloaded] == ["addk_1", "addk_2", "addk_3"]
    assert [(d["model"], d["level"]) for d in failed] == [("broken", "WARNING")]
    node = loaded[0]["node"]
    assert node == "node0"  # the backend's name, as in metrics and status
    for d in loaded + unloaded + failed:
        assert d["node"] == node and d["duration_s"] > 0 and d["bytes"] > 0 and d["version"] == 1
    for d in evicted:
        assert d["node"] == node and d["bytes"] > 0 and d["idle_s"] >= 0
    assert all(d["measured"] is True for d in loaded)
    # Every line tfscache serve itself wrote is JSON (TensorFlow may write text of its own).
    text = [line for line in serve.log_text().splitlines() if not line.startswith("{")]
    assert not [line for line in text if " tfscache.cache" in line or " tfscache.app" in line
                or " tfscache.frontend" in line or " tfscache.kinds.supervisor" in line]
