"""Prefetch loads in Prometheus, counted apart from the other loads (docs/prefetch.md).

``tfscache_prefetch_loads_total{node, outcome}`` per local node whose cache prefetches, with
``outcome`` one of ``started`` (sent to the node), ``completed``, ``failed``, ``used`` (the model
was then requested before it left) and ``wasted`` (evicted unused). Read from each node's
``CacheManager.prefetch_counts`` when scraped; a node with prefetch off has no series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily

from tfscache.observe.gauges import NodeView


class PrefetchCollector:
    """Collects ``tfscache_prefetch_loads_total`` from the local nodes' caches."""

    def __init__(self, nodes: Callable[[], Iterable[NodeView]]) -> None:
        self._nodes = nodes

    def describe(self):
        return []  # computed at collect time

    def collect(self):
        family = CounterMetricFamily(
            "tfscache_prefetch_loads",
            "Co-access prefetch loads of a node, by outcome "
            "(started, completed, failed, used, wasted).",
            labels=["node", "outcome"],
        )
        for view in self._nodes():
            counts = prefetch_counts(view.cache)
            for outcome, value in (counts or {}).items():
                family.add_metric([view.name, outcome], value)
        return [family]


def prefetch_counts(cache) -> dict[str, int] | None:
    """A node's prefetch counts (``PrefetchCounts.as_dict``), None with prefetch off or the node down."""
    counts = cache.prefetch_counts if cache is not None else None
    return counts.as_dict() if counts is not None else None
