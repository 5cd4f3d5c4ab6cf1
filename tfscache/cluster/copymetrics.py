"""Prometheus metrics of copies that follow load, read from ``Spread`` at scrape time.

* ``tfscache_copy_spills_total{node}``: requests sent past their model's first copy because
  the copies before it were over their bound (``node``: where they went);
* ``tfscache_copies_added_total{node}`` / ``tfscache_copies_removed_total{node}``: extra
  copies this front end added on ``node`` / dropped after they cooled down;
* ``tfscache_copies_unloaded_total{node}``: models a local node's cache unloaded because
  they were none of its copies and idle for ``copies.cool_s``;
* ``tfscache_extra_copies``: extra copies in use now (all models);
* ``tfscache_model_copies{model}``: copies of each model that has extra ones, only with
  ``server.metrics_per_model`` (one series per model, as for the other per-model metrics).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tfscache.cluster.spread import Spread

_COUNTERS = (
    (
        "tfscache_copy_spills",
        "Requests sent past their model's first copy because the copies before it were "
        "over their load bound, by the node they went to.",
        "spills",
    ),
    ("tfscache_copies_added", "Extra copies of busy models added, by node.", "added"),
    ("tfscache_copies_removed", "Extra copies dropped after they cooled down, by node.", "removed"),
    (
        "tfscache_copies_unloaded",
        "Models a local node unloaded as none of its copies, idle for copies.cool_s.",
        "unloaded",
    ),
)


class CopiesCollector:
    """Registered in the front end's registry when copies are on."""

    def __init__(self, spread: Spread, per_model: bool = False) -> None:
        self._spread = spread
        self._per_model = per_model

    def describe(self):
        return []  # computed at collect time

    def collect(self):
        spread = self._spread
        for name, doc, attr in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["node"])
            for node, count in sorted(getattr(spread, attr).items()):
                family.add_metric([node], count)
            yield family
        copies = spread.counts()
        yield GaugeMetricFamily(
            "tfscache_extra_copies",
            "Extra copies of busy models in use now.",
            value=sum(len(nodes) - spread.rule.min_copies for nodes in copies.values()),
        )
        if self._per_model:
            family = GaugeMetricFamily(
                "tfscache_model_copies", "Copies of a model that has extra ones.", labels=["model"]
            )
            for model, nodes in sorted(copies.items()):
                family.add_metric([model], len(nodes))
            yield family
