"""deploy/monitoring against a real `tfscache serve`, its request id, and its request log.

One serve (one embedded `tfscache node` capped at 1 model, metrics on a port picked at
start, ``--request-log``, the admin API) over addk_1, addk_2 and a corrupt model. The
``driven`` fixture sends a few requests of every kind first (cold, warm, an eviction, a load
that waits for room behind a pinned model and is refused, a failed load, REST and gRPC, an
unknown model), so counters and histograms have series; then:

* every metric the Grafana dashboard and the PrometheusRule query (their PromQL parsed by
  promql-parser) is on the serve's /metrics (``up`` is Prometheus's own);
* the request id comes back (gRPC trailing metadata, REST header), the caller's or a new one;
* the request log has one row per request served by the node, and `tfscache simulate`
  replays it and reports that many requests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import promql_parser
import pytest
import requests
import yaml

from support.admin import start_admin_serve
from deploy import manifests
from support.serving import add_broken_model, link_repository
from support import fixtures
from support.node import PYTHON, REPO
from support.requests import predict_request
from support.waiting import wait_until
from tfscache.observe.requestlog import COLUMNS

from .promtext import Scrape

MONITORING = Path(REPO) / "deploy" / "monitoring"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself for every target
GRAFANA_VARIABLES = {"$__rate_interval": "5m"}  # what Grafana puts in before a query reaches Prometheus


@pytest.fixture(scope="module")
def repo(synthetic_models, tmp_path_factory):
    return add_broken_model(link_repository(tmp_path_factory.mktemp("monitoring") / "models", synthetic_models([1, 2])))


@pytest.fixture(scope="module")
def serve(repo, tmp_path_factory):
    directory = tmp_path_factory.mktemp("serve")
    request_log = directory / "requests.csv"
    with start_admin_serve(directory, repo, "--local-nodes", "1", "--max-models-per-node", "1",
                           "--metrics-port", "0", "--request-log", str(request_log),
                           "--set", "cache.failure_backoff_s=0", "--set", "cache.room_timeout_s=0.3") as process:
        process.request_log = request_log
        yield process


stub = fixtures.stub_on("serve")


def scrape(serve) -> Scrape:
    reply = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10)
    assert reply.status_code == 200
    return Scrape(reply.text)


def rest_predict(serve, name: str, headers: dict | None = None) -> requests.Response:
    return requests.post(f"{serve.rest_url}/v1/models/{name}:predict",
                         json={"instances": [1.0]}, headers=headers or {}, timeout=120)


def admin(serve, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", *args, "--address", serve.admin_target], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def driven(serve, stub):
    """Requests of every kind; returns how many took a lease on the node (the request log's rows)."""
    served = 0
    for name in ("addk_1", "addk_1", "addk_2", "addk_1"):  # cold, warm, evicts addk_1, evicts addk_2
        stub.Predict(predict_request(name, 1.0), timeout=120)
        served += 1
    # A load that waits for room and finds none: addk_1 is pinned, the cap is 1.
    assert admin(serve, "pin", "addk_1").returncode == 0
    with pytest.raises(grpc.RpcError) as refused:
        stub.Predict(predict_request("addk_2", 1.0), timeout=120)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    served += 1
    assert admin(serve, "unpin", "addk_1").returncode == 0
    assert rest_predict(serve, "addk_1").status_code == 200
    served += 1
    with pytest.raises(grpc.RpcError) as failed:  # a load that fails: a lease was asked for, and refused
        stub.Predict(predict_request("broken", 1.0), timeout=120)
    assert failed.value.code() != grpc.StatusCode.OK
    served += 1
    with pytest.raises(grpc.RpcError) as unknown:  # no such model: refused before any lease
        stub.Predict(predict_request("nosuchmodel", 1.0), timeout=120)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    stub.Predict(predict_request("addk_1", 1.0), timeout=120)  # the last: a model stays resident, idle
    return served + 1


def queries() -> dict[str, str]:
    """Every PromQL expression of the dashboard and the alerts, by where it is."""
    found = {}
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found[f"dashboard: {panel['title']} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found[f"dashboard: ${variable['name']}"] = variable["definition"].removeprefix(
                "label_values(").rsplit(",", 1)[0]
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    for group in rules["spec"]["groups"]:
        for rule in group["rules"]:
            found[f"alert: {rule['alert']}"] = rule["expr"]
    return found


def metric_names(expr: str) -> set[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    names = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_the_monitoring_files_cover_what_the_issue_asks():
    found = queries()
    alerts = {where.removeprefix("alert: ") for where in found if where.startswith("alert: ")}
    assert {"TfscacheThrashing", "TfscacheResourceExhausted", "TfscacheNodeDown", "TfscacheLoadFailures"} <= alerts
    every = set().union(*map(metric_names, found.values()))
    assert {"tfscache_requests_total", "tfscache_request_duration_seconds_bucket", "tfscache_cache_hits_total",
            "tfscache_cache_misses_total", "tfscache_evictions_total", "tfscache_used_models", "tfscache_cap_models",
            "tfscache_node_healthy", "tfscache_load_failures_total"} <= every
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    service = yaml.safe_load((MONITORING / "service-metrics.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"service-metrics.yaml", "servicemonitor.yaml", "prometheusrule.yaml"}
    # The Service selects the StatefulSet's pods and their metrics port, at the port they listen on.
    pods = manifests.load_k8s()[("StatefulSet", "tfscache")]["spec"]["template"]  # as kustomize renders deploy/k8s
    assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
    [port] = service["spec"]["ports"]
    assert ports[port["targetPort"]] == port["port"]


def test_every_metric_the_dashboard_and_alerts_query_is_exported(serve, driven):
    exported = {sample.name for sample in scrape(serve).samples}
    missing = {where: sorted(metric_names(expr) - exported - PROMETHEUS_OWN) for where, expr in queries().items()}
    assert {where: names for where, names in missing.items() if names} == {}


def test_the_request_id_comes_back_over_grpc_and_rest(serve, stub, driven):
    _, call = stub.Predict.with_call(predict_request("addk_1", 1.0), timeout=120,
                                     metadata=(("x-request-id", "caller-7"),))
    assert ("x-request-id", "caller-7") in tuple(call.trailing_metadata())
    _, call = stub.Predict.with_call(predict_request("addk_1", 1.0), timeout=120)
    assert dict(call.trailing_metadata())["x-request-id"]  # made for a request that came without one
    assert rest_predict(serve, "addk_1", {"X-Request-Id": "caller-8"}).headers["X-Request-Id"] == "caller-8"
    missing = rest_predict(serve, "nosuchmodel")
    assert missing.status_code == 404 and missing.headers["X-Request-Id"]


def test_the_request_log_replays_in_tfscache_simulate(serve, driven):
    rows = wait_until(lambda: _rows(serve.request_log, driven), 30, f"{driven} rows in the request log")
    assert [r["model"] for r in rows[:4]] == ["addk_1", "addk_1", "addk_2", "addk_1"]
    assert [r["cold"] for r in rows[:4]] == ["1", "0", "1", "1"]
    cold = rows[0]
    assert float(cold["load_seconds"]) > 0 and int(cold["bytes"]) > 0 and cold["node"] == "node0"
    assert (cold["version"], cold["code"]) == ("1", "OK")
    assert rows[1]["load_seconds"] == cold["load_seconds"]  # a warm request carries its model's last load
    assert (rows[4]["model"], rows[4]["cold"], rows[4]["code"]) == ("addk_2", "1", "RESOURCE_EXHAUSTED")
    assert (rows[6]["model"], rows[6]["cold"]) == ("broken", "1") and rows[6]["code"] != "OK"
    done = subprocess.run([PYTHON, "-m", "tfscache", "simulate", str(serve.request_log), "--json", "--quiet",
                           "--max-models", "1,2"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["requests"] >= driven and report["models"] >= 3
    assert report["requests"] == len(_rows(serve.request_log, 0))


def _rows(path: Path, at_least: int) -> list[dict] | None:
    import csv

    with open(path, newline="") as stream:
        reader = csv.DictReader(stream)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    return rows if len(rows) >= at_least else None


def test_a_request_log_in_a_missing_directory_is_refused_at_once(tmp_path, repo):
    done = subprocess.run([PYTHON, "-m", "tfscache", "serve", "--model-repository", str(repo),
                           "--request-log", str(tmp_path / "nowhere" / "requests.csv")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert "server.request_log" in done.stderr and "nowhere" in done.stderr
