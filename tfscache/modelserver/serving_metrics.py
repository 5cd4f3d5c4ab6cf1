"""TF Serving's own metrics, and the Prometheus page --monitoring_config_file serves.

The metrics are those tensorflow_model_server registers, with its names, labels, units
(microseconds) and buckets; each is recorded where the C++ server records it:

==============================================  ===========================  ==========================
metric (page name: "/" -> ":")                  labels                       recorded
==============================================  ===========================  ==========================
/tensorflow/serving/request_count               model_name, status           every gRPC Predict, Classify,
                                                                             Regress; every REST /v1/ request
/tensorflow/serving/request_latency             model_name, API, entrypoint  the same, when they succeed
/tensorflow/serving/runtime_latency             model_name, API, runtime     around Session::Run of Predict,
                                                                             Classify, Regress (runtime "TF1")
/tensorflow/serving/request_example_counts      model                        MultiInference: its examples
/tensorflow/serving/request_example_count_total model                        (sv/multi_inference.cc)
/tensorflow/cc/saved_model/load_attempt_count   model_path, status           each SavedModel load, ok or not
/tensorflow/cc/saved_model/load_latency         model_path                   successful loads, microseconds
/tensorflow/serving/model_warmup_latency        model_path, status           every warm-up that found its file
/tensorflow/serving/model_warmup_records_read   model_path, status           (warmup.py), micros / records
==============================================  ===========================  ==========================

Not exported, because the node does not do the work they measure: the batching queues,
request_log_count, mlmd_map, and TensorFlow runtime's own :tensorflow:core:* metrics
(Python cannot read TF's C++ CollectionRegistry).

``prometheus_page()`` writes the page as util/prometheus_exporter.cc does: metrics sorted
by name, a ``# TYPE`` line for each (also before any sample), histograms with one bucket
per limit of ``Buckets::Exponential`` and ``+Inf``, doubles as ``%.6g``. The registry is
process-wide, like TF's ``CollectionRegistry::Default()``.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field

DEFAULT_PATH = "/monitoring/prometheus/metrics"  # PrometheusExporter::kPrometheusPath


def exponential_buckets(scale: float, growth: float, count: int) -> tuple[float, ...]:
    """monitoring::Buckets::Exponential: ``count`` limits, then DBL_MAX (the +Inf bucket)."""
    return tuple(scale * growth**i for i in range(count)) + (sys.float_info.max,)


LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)  # microseconds, up to ~20 minutes


@dataclass
class Counter:
    """monitoring::Counter<N>: an int64 per label tuple."""

    name: str
    description: str
    labels: tuple[str, ...]
    cells: dict[tuple[str, ...], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def increment(self, values: tuple[str, ...], by: int = 1) -> None:
        with self.lock:
            self.cells[values] = self.cells.get(values, 0) + int(by)

    def lines(self, page_name: str) -> list[str]:
        with self.lock:
            cells = sorted(self.cells.items())
        return [f"# TYPE {page_name} counter"] + [
            f"{page_name}{{{_labels(self.labels, values)}}} {value}" for values, value in cells]


@dataclass
class Sampler:
    """monitoring::Sampler<N>: a histogram per label tuple (a value lands in the first
    bucket whose limit is above it, as tensorflow::histogram::Histogram::Add)."""

    name: str
    description: str
    labels: tuple[str, ...]
    limits: tuple[float, ...]
    cells: dict[tuple[str, ...], tuple[list[int], list[float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, values: tuple[str, ...], sample: float) -> None:
        index = min(bisect_right(self.limits, sample), len(self.limits) - 1)
        with self.lock:
            cell = self.cells.get(values)
            if cell is None:
                cell = self.cells[values] = ([0] * len(self.limits), [0.0])
            cell[0][index] += 1
            cell[1][0] += sample

    def lines(self, page_name: str) -> list[str]:
        with self.lock:
            cells = sorted((values, (list(b), s[0])) for values, (b, s) in self.cells.items())
        lines = [f"# TYPE {page_name} histogram"]
        for values, (buckets, total) in cells:
            labels = _labels(self.labels, values)
            prefix = f"{page_name}_bucket{{{labels}{',' if labels else ''}"
            cumulative = 0
            for i, count in enumerate(buckets):
                cumulative += count
                limit = _double(self.limits[i]) if i < len(buckets) - 1 else "+Inf"
                lines.append(f'{prefix}le="{limit}"}} {cumulative}')
            lines.append(f"{page_name}_sum{{{labels}}} {_double(total)}")
            lines.append(f"{page_name}_count{{{labels}}} {cumulative}")
        return lines


def _double(value: float) -> str:
    """absl::StrCat(double): six significant digits, as %.6g."""
    return f"{value:.6g}"


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f'{_label_name(n)}="{_label_value(v)}"' for n, v in zip(names, values))


def _label_name(name: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def page_name(name: str) -> str:
    """GetPrometheusMetricName: every character outside [a-zA-Z0-9_] becomes ':'."""
    name = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return f"_{name}" if name[:1].isdigit() else name


REQUEST_COUNT = Counter("/tensorflow/serving/request_count", "The total number of requests.",
                        ("model_name", "status"))
REQUEST_LATENCY = Sampler(
    "/tensorflow/serving/request_latency",
    "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
    ("model_name", "API", "entrypoint"), LATENCY_BUCKETS)
RUNTIME_LATENCY = Sampler(
    "/tensorflow/serving/runtime_latency",
    "Distribution of wall time (in microseconds) for Tensorflow runtime.",
    ("model_name", "API", "runtime"), LATENCY_BUCKETS)
EXAMPLE_COUNTS = Sampler("/tensorflow/serving/request_example_counts",
                         "The number of tensorflow.Examples per request.", ("model",),
                         exponential_buckets(1, 2, 15))
EXAMPLE_COUNT_TOTAL = Counter("/tensorflow/serving/request_example_count_total",
                              "The total number of tensorflow.Examples.", ("model",))
LOAD_ATTEMPT_COUNT = Counter("/tensorflow/cc/saved_model/load_attempt_count",
                             "The number of times a SavedModel was successfully loaded.",
                             ("model_path", "status"))
LOAD_LATENCY = Counter("/tensorflow/cc/saved_model/load_latency",
                       "Latency in microseconds for SavedModels that were successfully loaded.",
                       ("model_path",))
WARMUP_LATENCY = Sampler(
    "/tensorflow/serving/model_warmup_latency",
    "Distribution of wall time (in microseconds) for warming up the model.",
    ("model_path", "status"), LATENCY_BUCKETS)
WARMUP_RECORDS_READ = Counter("/tensorflow/serving/model_warmup_records_read",
                              "Total number of warmup records read during model warmup.",
                              ("model_path", "status"))
METRICS: tuple[Counter | Sampler, ...] = (
    REQUEST_COUNT, REQUEST_LATENCY, RUNTIME_LATENCY, EXAMPLE_COUNTS, EXAMPLE_COUNT_TOTAL,
    LOAD_ATTEMPT_COUNT, LOAD_LATENCY, WARMUP_LATENCY, WARMUP_RECORDS_READ)


def prometheus_page() -> str:
    """PrometheusExporter::GeneratePage."""
    lines: list[str] = []
    for metric in sorted(METRICS, key=lambda m: m.name):
        lines.extend(metric.lines(page_name(metric.name)))
    return "\n".join(lines) + "\n"


def micros_since(start: float) -> int:
    """Whole microseconds since ``start`` (a ``time.perf_counter()`` reading)."""
    return max(0, int((time.perf_counter() - start) * 1_000_000))


def record_request(model_name: str, api: str, entrypoint: str, status: str, start: float) -> None:
    """RecordModelRequestCount, and RecordRequestLatency when the request succeeded."""
    if status == "OK":
        REQUEST_LATENCY.add((model_name, api, entrypoint), micros_since(start))
    REQUEST_COUNT.increment((model_name, status))


class runtime_latency:  # noqa: N801 - used as a function: `with runtime_latency(name, api):`
    """RecordRuntimeLatency around a session run (recorded only when the run succeeds)."""

    __slots__ = ("labels", "start")

    def __init__(self, model_name: str, api: str) -> None:
        self.labels = (model_name, api, "TF1")

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            RUNTIME_LATENCY.add(self.labels, micros_since(self.start))


def record_examples(model_name: str, count: int) -> None:
    """RecordRequestExampleCount."""
    EXAMPLE_COUNTS.add((model_name,), count)
    EXAMPLE_COUNT_TOTAL.increment((model_name,), count)


def record_warmup(model_path: str, status: str, start: float, records: int) -> None:
    """RunSavedModelWarmup's model_warmup_latency and model_warmup_records_read."""
    WARMUP_LATENCY.add((model_path, status), micros_since(start))
    WARMUP_RECORDS_READ.increment((model_path, status), records)


def record_load(model_path: str, start: float, ok: bool) -> None:
    """LoadSavedModel's load_attempt_count, and load_latency for a successful load."""
    LOAD_ATTEMPT_COUNT.increment((model_path, "success" if ok else "fail"))
    if ok:
        LOAD_LATENCY.increment((model_path,), micros_since(start))
