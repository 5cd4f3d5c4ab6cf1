#!/usr/bin/env python
"""The first request after a load, with and without warm-up (issue 25; tfscache/modelserver/warmup.py).

    .venv/bin/python scripts/bench_warmup.py [--models 12]

Two ``tfscache node`` processes in the same run serve the same N copies of TF Serving's
``half_plus_two`` (the regress/classify/predict test model), each version with a warm-up file
of four records (Predict, Classify, Regress, MultiInference: ``testmodels.warmup_logs``): one
node with ``--enable_model_warmup`` (TF Serving's default), the baseline with
``--enable_model_warmup=false``. Once every model is AVAILABLE, each model gets one gRPC
Predict (the first after its load), then a second (warm). Prints Markdown: medians and p90 of
the first and second requests, and the warm-up's own cost per load (``model_warmup_latency``
from the node's Prometheus page, which the warmed node paid inside the load). Loopback only;
both nodes are stopped on exit.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import grpc  # noqa: E402
import requests  # noqa: E402
from support.node import model_config, start_node  # noqa: E402
from support.requests import predict_request  # noqa: E402
from tensorflow_serving.apis import prediction_service_pb2_grpc  # noqa: E402

PAGE = "/monitoring/prometheus/metrics"


def build(root: Path, count: int) -> dict[str, Path]:
    from support.models import tfserving as testmodels  # noqa: PLC0415 (tensorflow: only here)

    source = testmodels.build_test_models(root / "built")["half_plus_two"] / "00000123"
    bases = {}
    for i in range(count):
        name = f"m{i}"
        shutil.copytree(source, root / name / "1")
        testmodels.write_warmup(root / name / "1", testmodels.warmup_logs(name))
        bases[name] = root / name
    (root / "monitoring.txt").write_text('prometheus_config: { enable: true, path: "%s" }\n' % PAGE)
    return bases


def first_and_second(node, names: list[str]) -> tuple[list[float], list[float]]:
    first, second = [], []
    with grpc.insecure_channel(node.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for name in names:
            for into in (first, second):
                started = time.perf_counter()
                reply = stub.Predict(predict_request(name, 2.0), timeout=60)
                into.append(time.perf_counter() - started)
                assert list(reply.outputs["y"].float_val) == [3.0]
    return first, second


def warmup_micros(node) -> list[float]:
    page = requests.get(node.rest_url + PAGE, timeout=10).text
    sums = re.findall(r'^:tensorflow:serving:model_warmup_latency_sum\{[^}]*status="OK"\} (\S+)$', page, re.M)
    return [float(v) for v in sums]


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(round(0.9 * len(values))) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-warmup-") as work:
        root = Path(work)
        bases = build(root, args.models)
        names = list(bases)
        results = {}
        for label, flag in (("with warm-up (TF Serving's default)", "--enable_model_warmup=true"),
                            ("without warm-up (baseline)", "--enable_model_warmup=false")):
            with start_node(root, config=model_config(bases), timeout=300,
                            flags=[f"--monitoring_config_file={root / 'monitoring.txt'}", flag]) as node:
                first, second = first_and_second(node, names)
                results[label] = (first, second, warmup_micros(node))
    print(f"{args.models} copies of half_plus_two, 4 warm-up records each (1 replay); one gRPC Predict each\n")
    print("| node | first request after load: median ms | p90 ms | second request: median ms | "
          "warm-up inside the load: median ms |")
    print("|---|---|---|---|---|")
    for label, (first, second, warm) in results.items():
        warm_ms = f"{statistics.median(warm) / 1000:.1f}" if warm else "-"
        print(f"| {label} | {statistics.median(first) * 1000:.2f} | {p90(first) * 1000:.2f} | "
              f"{statistics.median(second) * 1000:.2f} | {warm_ms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
