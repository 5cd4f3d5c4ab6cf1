"""One ``/metrics`` over many processes: the control process's registry plus its workers' counts.

With ``tfscache serve --workers N`` each worker process counts the requests it received in
its own prometheus registry. Its reports to the control process (every 100 ms) carry
``snapshot(registry)`` when due (``Snapshots``: every 0.5 s while it answers requests, and
at its drain): its cumulative samples, JSON-able::

    {"pid": 4242, "families": [
        {"name": "tfscache_requests", "type": "counter", "help": "...",
         "samples": [["tfscache_requests_total",
                      {"protocol": "grpc", "method": "Predict", "code": "OK"}, 7.0]]},
        ...]}

The control process keeps the latest snapshot of each worker in a ``WorkerMetrics``
(``update``) and exports, per (sample name, labels), its own value plus every live
worker's plus what retired workers left (``collect``: a collector, so ``generate_latest``
writes it). When a worker dies or is replaced (``retire``, or an update from a new pid under
the same id), its counters and histograms are folded into a base that stays, so a counter
never goes backwards although the new process counts from 0; its gauges (its in-flight
requests) are dropped with it. A late report from a retired process is ignored.

Sums keep each metric's meaning: a counter or histogram of all workers is the sum of
theirs (histogram buckets of the same bounds stay cumulative when summed), and a worker's
gauges are its share of a total (in flight). Families that describe one process or the
control process's own view are not in a snapshot (``PER_PROCESS``): process_*, python_info,
the build info, the ring's size and the scale advice; the control process's own are shown.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

SUMMED = ("counter", "gauge", "histogram")  # the family types a snapshot carries
KEPT = ("counter", "histogram")  # what a retired worker leaves in the base (gauges go with it)
PER_PROCESS = frozenset(
    {"python_info", "tfscache_build", "tfscache_ring_nodes", "tfscache_scale_advice"}
)
_RETIRED_PIDS = 1024  # how many retired pids are remembered to drop their late reports

SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted label pairs)


def _per_process(name: str) -> bool:
    return name in PER_PROCESS or name.startswith("process_")


def snapshot(registry: Any) -> dict[str, Any]:
    """The registry's cumulative counters, gauges and histograms, JSON-able (see the module docstring)."""
    families = []
    for family in registry.collect():
        if family.type not in SUMMED or _per_process(family.name):
            continue
        families.append(
            {
                "name": family.name,
                "type": family.type,
                "help": family.documentation,
                "samples": [[s.name, dict(s.labels), float(s.value)] for s in family.samples],
            }
        )
    return {"pid": os.getpid(), "families": families}


class Snapshots:
    """When a worker's report carries a snapshot (``take``; None: not this time).

    A snapshot costs a collect of the whole registry (about 2-3 ms on the build machine for a
    worker's usual families; far more with ``metrics_per_model`` and many models), so a worker
    takes one only when it answered requests since the last (``metrics.answered`` moved), at
    most every ``every_s``, and never more than ``share`` of its time (the interval grows with
    what the last one cost). The last one, at a drain, is forced. So /metrics lags a worker by
    about ``every_s``, and a SIGKILLed worker's counts since its last snapshot are lost (never
    counted backwards)."""

    def __init__(self, metrics: Any, *, every_s: float = 0.5, share: float = 0.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``metrics``: the worker's ``Metrics`` (its ``registry`` and ``answered``)."""
        self._metrics = metrics
        self.every_s, self.share = every_s, share
        self._clock = clock
        self._next = float("-inf")
        self._seen: int | None = None

    def take(self, force: bool = False) -> dict[str, Any] | None:
        now = self._clock()
        answered = self._metrics.answered
        if not force and (now < self._next or answered == self._seen):
            return None
        snap = snapshot(self._metrics.registry)
        cost = self._clock() - now
        self._seen = answered
        self._next = now + max(self.every_s, cost / self.share)
        return snap


class _Family:
    """One family being summed: its type, help, and samples in the order first seen."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.type, self.help = name, kind, help_text
        self.values: dict[SampleKey, list] = {}  # -> [labels as first seen, summed value]

    def add(self, sample_name: str, labels: dict[str, str], value: float) -> None:
        key = (sample_name, tuple(sorted(labels.items())))
        entry = self.values.get(key)
        if entry is None:
            self.values[key] = [dict(labels), value]
        else:
            entry[1] += value

    def metric(self) -> Metric:
        metric = Metric(self.name, self.help, self.type)
        for (sample_name, _), (labels, value) in self.values.items():
            metric.add_sample(sample_name, labels, value)
        return metric


def _add_snapshot(
    families: dict[str, _Family], snap: dict[str, Any], kinds: Iterable[str] = SUMMED
) -> None:
    for family in snap.get("families", ()):
        if family["type"] not in kinds or _per_process(family["name"]):
            continue
        into = families.get(family["name"])
        if into is None:
            into = families[family["name"]] = _Family(
                family["name"], family["type"], family.get("help", "")
            )
        elif into.type != family["type"]:
            # a family of another type under the same name: not summable, the first one wins
            continue
        for sample_name, labels, value in family["samples"]:
            into.add(sample_name, labels, float(value))


class WorkerMetrics:
    """The control process's merge: its ``registry`` plus the workers' latest snapshots and the base."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self._latest: dict[Any, dict[str, Any]] = {}  # worker id -> its latest snapshot
        self._base: dict[str, _Family] = {}  # counters and histograms that retired workers left
        self._retired: dict[int, None] = {}  # pids retired, oldest first (bounded)
        # The control process's list of its workers for /status (tfscache.workers.control sets it):
        # [{"id", "pid", "in_flight", "restarts", "delegations"}, ...]; None with one process.
        self.status: Callable[[], list[dict[str, Any]]] | None = None

    def update(self, worker_id: Any, snap: dict[str, Any]) -> None:
        """A worker's latest cumulative snapshot. One from a new pid under ``worker_id`` retires the
        old process first; one from a retired pid (a report that arrived late) is ignored."""
        pid = snap.get("pid")
        if pid in self._retired:
            return
        before = self._latest.get(worker_id)
        if before is not None and before.get("pid") != pid:
            self.retire(worker_id)
        self._latest[worker_id] = snap

    def retire(self, worker_id: Any) -> None:
        """A worker died or stopped: keep its counters and histograms in the base, drop its gauges."""
        snap = self._latest.pop(worker_id, None)
        if snap is None:
            return
        _add_snapshot(self._base, snap, KEPT)
        pid = snap.get("pid")
        if pid is not None:
            self._retired[pid] = None
            while len(self._retired) > _RETIRED_PIDS:
                del self._retired[next(iter(self._retired))]

    @property
    def merging(self) -> bool:
        """Whether any worker's counts are in (a live snapshot, or a retired worker's base)."""
        return bool(self._latest or self._base)

    def workers(self) -> list[Any]:
        """The ids of the workers with a live snapshot."""
        return list(self._latest)

    def counted(self, worker_id: Any, sample_name: str) -> float:
        """``sample_name`` summed over every label set in the live process ``worker_id``'s latest
        snapshot (0 without one): e.g. the requests it received, for /status."""
        snap = self._latest.get(worker_id, {})
        return sum(
            float(value)
            for family in snap.get("families", ())
            for name, _, value in family["samples"]
            if name == sample_name
        )

    def collect(self) -> Iterator[Metric]:
        """Every family of the registry, then those only the workers have, summed per (sample, labels).
        Without workers (none yet, none ever retired) the registry's own, untouched."""
        if not self.merging:
            yield from self.registry.collect()
            return
        families: dict[str, _Family] = {}
        # the registry's own non-summed families are passed through as they are
        order: list[Metric | str] = []
        for metric in self.registry.collect():
            if metric.type in SUMMED and metric.name not in families:
                family = families[metric.name] = _Family(
                    metric.name, metric.type, metric.documentation
                )
                for sample in metric.samples:
                    family.add(sample.name, sample.labels, sample.value)
                order.append(metric.name)
            else:
                order.append(metric)
        known = set(families)
        for family in self._base.values():
            _merge_family(families, family)
        for snap in list(self._latest.values()):
            _add_snapshot(families, snap)
        order.extend(name for name in families if name not in known)
        for item in order:
            yield families[item].metric() if isinstance(item, str) else item

    def total(self, sample_name: str) -> float:
        """One sample name summed over every label set and every process (e.g. the cache hits)."""
        return sum(
            s.value for family in self.collect() for s in family.samples if s.name == sample_name
        )


def _merge_family(families: dict[str, _Family], family: _Family) -> None:
    into = families.get(family.name)
    if into is None:
        into = families[family.name] = _Family(family.name, family.type, family.help)
    elif into.type != family.type:
        return
    for (sample_name, _), (labels, value) in family.values.items():
        into.add(sample_name, labels, value)
