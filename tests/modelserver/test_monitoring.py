"""TF Serving's observability in ``tfscache node``: --monitoring_config_file (the Prometheus
page on the REST port, TF Serving's metric names and format) and --grpc_socket_path.

One node serves the module, started as TF Serving's own harness starts it
(model_servers/test_util/tensorflow_model_server_test_base.py: --grpc_socket_path on every
start, --monitoring_config_file with testdata/monitoring_config.txt); the upstream tests
testPrometheusEndpoint and testPredictUDS run against it. Counts are asserted as
differences between two scrapes, so the tests do not depend on each other's order.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import grpc
import pytest
import requests
from support.node import node_command, start_node
from support.requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tfscache.modelserver import serving_metrics
from tfscache.modelserver.server_configs import (
    ConfigFileError,
    MonitoringConfig,
    prometheus_path,
    read_config_file,
)

# tensorflow_serving/servables/tensorflow/testdata/monitoring_config.txt
UPSTREAM_MONITORING_CONFIG = 'prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n'
PAGE = "/monitoring/prometheus/metrics"


@pytest.fixture(scope="module")
def node(tmp_path_factory, test_models):
    root = tmp_path_factory.mktemp("monitored")
    base = root / "half_plus_two_cpu"  # the upstream harness's model: version 00000123 only
    shutil.copytree(test_models / "half_plus_two" / "00000123", base / "00000123")
    (root / "monitoring_config.txt").write_text(UPSTREAM_MONITORING_CONFIG)
    with start_node(root, model_name="default", model_base_path=str(base),
                    flags=[f"--grpc_socket_path={root / 'tf-serving.sock'}",
                           f"--monitoring_config_file={root / 'monitoring_config.txt'}",
                           "--rest_api_timeout_in_ms=5000"]) as node:
        node.socket_path = root / "tf-serving.sock"
        node.base = base
        yield node


def scrape(node) -> str:
    response = requests.get(node.rest_url + PAGE, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/plain"
    return response.text


def sample(page: str, series: str) -> float:
    """The value of one series (name and labels exactly as printed), 0 when absent."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", page, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def predict_over(channel, name: str = "default"):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return stub.Predict(predict_request(name, 2.0), timeout=30)


def test_prometheus_endpoint(node):
    """Upstream testPrometheusEndpoint: the page has metric type information."""
    assert "# TYPE" in scrape(node)


def test_predict_over_the_unix_socket(node):
    """Upstream testPredictUDS: the official stubs over unix:PATH."""
    with grpc.insecure_channel(f"unix:{node.socket_path}") as channel:
        response = predict_over(channel)
    assert list(response.outputs["y"].float_val) == [3.0]
    assert response.model_spec.version.value == 123


def test_grpc_requests_are_counted_by_model_and_status(node):
    before = scrape(node)
    with grpc.insecure_channel(node.grpc_target) as channel:
        predict_over(channel)
        predict_over(channel)
        with pytest.raises(grpc.RpcError) as info:
            predict_over(channel, "missing")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    after = scrape(node)
    count = ":tensorflow:serving:request_count"
    assert sample(after, f'{count}{{model_name="default",status="OK"}}') - \
        sample(before, f'{count}{{model_name="default",status="OK"}}') == 2
    assert sample(after, f'{count}{{model_name="missing",status="NOT_FOUND"}}') - \
        sample(before, f'{count}{{model_name="missing",status="NOT_FOUND"}}') == 1
    # latency only for the ones that succeeded, in microseconds, with TF Serving's buckets
    latency = ':tensorflow:serving:request_latency_count{model_name="default",API="Predict",entrypoint="GRPC"}'
    assert sample(after, latency) - sample(before, latency) == 2
    assert "missing" not in "".join(re.findall(r"^:tensorflow:serving:request_latency.*$", after, re.MULTILINE))
    runtime = ':tensorflow:serving:runtime_latency_count{model_name="default",API="Predict",runtime="TF1"}'
    assert sample(after, runtime) - sample(before, runtime) == 2
    buckets = re.findall(r'^:tensorflow:serving:request_latency_bucket\{model_name="default",API="Predict",'
                         r'entrypoint="GRPC",le="([^"]+)"\} (\d+)$', after, re.MULTILINE)
    assert [le for le, _ in buckets] == [f"{10 * 1.8**i:.6g}" for i in range(33)] + ["+Inf"]
    assert buckets[-1][1] == str(int(sample(after, latency)))
    assert [int(n) for _, n in buckets] == sorted(int(n) for _, n in buckets)  # cumulative


def test_rest_requests_are_counted_with_the_url_method(node):
    before = scrape(node)
    assert requests.post(f"{node.rest_url}/v1/models/default:predict", json={"instances": [1.0]},
                         timeout=30).status_code == 200
    assert requests.get(f"{node.rest_url}/v1/models/nothere", timeout=30).status_code == 404
    after = scrape(node)
    latency = ':tensorflow:serving:request_latency_count{model_name="default",API="predict",entrypoint="REST"}'
    assert sample(after, latency) - sample(before, latency) == 1
    missing = ':tensorflow:serving:request_count{model_name="nothere",status="NOT_FOUND"}'
    assert sample(after, missing) - sample(before, missing) == 1


def test_the_load_is_counted_with_its_path(node):
    page = scrape(node)
    model_path = node.base / "00000123"
    assert sample(page, f':tensorflow:cc:saved_model:load_attempt_count{{model_path="{model_path}",'
                        'status="success"}') == 1
    assert sample(page, f':tensorflow:cc:saved_model:load_latency{{model_path="{model_path}"}}') > 0


def test_other_paths_keep_their_answers(node):
    assert requests.get(node.rest_url + "/monitoring/prometheus", timeout=10).status_code == 404
    assert requests.get(node.rest_url + PAGE + "/", timeout=10).status_code == 404


# -- the page format, without a node ---------------------------------------------------


def test_page_format_is_tf_servings():
    counter = serving_metrics.Counter("/a/b-c", "help", ("model name", "status"))
    sampler = serving_metrics.Sampler("/a/h", "help", ("m",), serving_metrics.exponential_buckets(1, 2, 3))
    empty = serving_metrics.Counter("/a/empty", "help", ("x",))
    counter.increment(('say "hi" \\', "OK"), 3)
    for value in (0.5, 1, 3.9, 4, 1e9):
        sampler.add(("x",), value)
    assert counter.lines(serving_metrics.page_name(counter.name)) == [
        "# TYPE :a:b:c counter", ':a:b:c{model_name="say \\"hi\\" \\\\",status="OK"} 3']
    assert sampler.lines(serving_metrics.page_name(sampler.name)) == [
        "# TYPE :a:h histogram",
        ':a:h_bucket{m="x",le="1"} 1',     # a value lands below the first limit above it
        ':a:h_bucket{m="x",le="2"} 2',
        ':a:h_bucket{m="x",le="4"} 3',
        ':a:h_bucket{m="x",le="+Inf"} 5',
        ':a:h_sum{m="x"} 1e+09',           # %.6g, as absl::StrCat(double)
        ':a:h_count{m="x"} 5']
    assert empty.lines(serving_metrics.page_name(empty.name)) == ["# TYPE :a:empty counter"]
    assert serving_metrics.page_name("9x/y") == "_9x:y"


def test_the_page_lists_every_metric_sorted_by_name():
    page = serving_metrics.prometheus_page()
    types = re.findall(r"^# TYPE (\S+) (\w+)$", page, re.MULTILINE)
    assert types == sorted(types)
    assert dict(types) == {
        ":tensorflow:cc:saved_model:load_attempt_count": "counter",
        ":tensorflow:cc:saved_model:load_latency": "counter",
        ":tensorflow:serving:model_warmup_latency": "histogram",
        ":tensorflow:serving:model_warmup_records_read": "counter",
        ":tensorflow:serving:request_count": "counter",
        ":tensorflow:serving:request_example_count_total": "counter",
        ":tensorflow:serving:request_example_counts": "histogram",
        ":tensorflow:serving:request_latency": "histogram",
        ":tensorflow:serving:runtime_latency": "histogram"}
    assert page.endswith("\n")


# -- the config file ---------------------------------------------------------------------


@pytest.mark.parametrize("text, path", [
    (UPSTREAM_MONITORING_CONFIG, PAGE),
    ("prometheus_config { enable: true }", PAGE),
    ('prometheus_config { enable: true path: "/metrics" }', "/metrics"),
    ('prometheus_config { path: "/metrics" }', None),
    ("", None),
])
def test_prometheus_path(tmp_path, text, path):
    (tmp_path / "m.config").write_text(text)
    assert prometheus_path(read_config_file(str(tmp_path / "m.config"), MonitoringConfig)) == path


def test_a_bad_config_file_names_the_file_and_the_parse_error(tmp_path):
    (tmp_path / "m.config").write_text("prometheus_config { enable: maybe }")
    with pytest.raises(ConfigFileError) as info:
        read_config_file(str(tmp_path / "m.config"), MonitoringConfig)
    assert info.value.message == f"Invalid protobuf file: '{tmp_path / 'm.config'}'"
    assert info.value.detail.startswith("Error parsing text-format tensorflow.serving.MonitoringConfig: 1:")


@pytest.mark.parametrize("content, expected", [
    ("prometheus_config { enable: yes please }",
     r"^Error parsing text-format tensorflow\.serving\.MonitoringConfig: 1:\d+ : .+\n"
     r"Failed to start server\. Error: INVALID_ARGUMENT: Invalid protobuf file: '.*m\.config'$"),
    (None, r"^Failed to start server\. Error: NOT_FOUND: .*m\.config; No such file or directory$"),
])
def test_node_with_a_bad_monitoring_config_exits_1(tmp_path, content, expected):
    config = tmp_path / "m.config"
    if content is not None:
        config.write_text(content)
    result = subprocess.run(
        node_command(["--port=0", "--model_name=m", f"--model_base_path={tmp_path}",
                      f"--monitoring_config_file={config}"]),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert re.search(expected, result.stderr, re.MULTILINE), result.stderr


async def test_a_custom_path_is_served_and_v1_still_dispatched():
    from aiohttp.test_utils import TestClient, TestServer

    from tfscache.modelserver.rest_api import make_rest_app

    app = make_rest_app(core=None, metrics_path="/metrics")
    async with TestClient(TestServer(app)) as client:
        page = await client.get("/metrics")
        assert page.status == 200
        assert "# TYPE :tensorflow:serving:request_count counter" in await page.text()
        assert (await client.get(PAGE)).status == 404
        malformed = await client.get("/v1/models:metrics")  # the dispatcher answers, not the page
        assert malformed.status == 400


def test_the_deploy_config_serves_the_default_page():
    """deploy/tfserving/monitoring.config (the real TF Serving's, in compose and k8s) parses as
    a MonitoringConfig that turns the page on, and every ConfigMap copy of it is the same text."""
    import yaml
    from support.process import REPO

    deployed = REPO / "deploy" / "tfserving" / "monitoring.config"
    assert prometheus_path(read_config_file(str(deployed), MonitoringConfig)) == PAGE
    copies = [doc["data"]["monitoring.config"]
              for manifest in sorted((REPO / "deploy" / "k8s").rglob("*.yaml"))
              for doc in yaml.safe_load_all(manifest.read_text())
              if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"
              and "monitoring.config" in (doc.get("data") or {})]
    assert copies and all(copy == deployed.read_text() for copy in copies)
