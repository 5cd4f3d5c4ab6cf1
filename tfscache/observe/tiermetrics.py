"""Prometheus metrics of the disk tier (a model repository in a bucket; tfscache.storage).

====================================  ==========================================================
tfscache_disk_tier_hits_total         fetches that found their version complete and current on
                                      disk (concurrent fetches of one version count once)
tfscache_disk_tier_misses_total       fetches that downloaded their version (once per download)
tfscache_disk_tier_evictions_total    versions deleted from the tier to make room
tfscache_disk_tier_evicted_bytes_total their bytes
tfscache_downloaded_bytes_total       bytes of model versions downloaded from the bucket
tfscache_download_duration_seconds    histogram of whole-version downloads
tfscache_disk_tier_bytes              bytes the tier holds now (downloads in progress included)
tfscache_disk_tier_cap_bytes          its cap (storage.cache_bytes)
tfscache_disk_tier_versions           complete versions on disk
tfscache_disk_tier_downloads_in_flight versions being downloaded now
====================================  ==========================================================

Series exist only when the model repository is a bucket.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from tfscache.storage.base import TierEvents

DOWNLOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class TierMetrics(TierEvents):
    """Counts the tier's events into ``registry``; ``watch(tier)`` adds its gauges (read at scrape)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._hits = Counter(
            "tfscache_disk_tier_hits", "disk tier fetches served from disk", registry=registry
        )
        self._misses = Counter(
            "tfscache_disk_tier_misses",
            "disk tier fetches that downloaded their version",
            registry=registry,
        )
        self._evictions = Counter(
            "tfscache_disk_tier_evictions",
            "versions deleted from the disk tier for room",
            registry=registry,
        )
        self._evicted = Counter(
            "tfscache_disk_tier_evicted_bytes",
            "bytes deleted from the disk tier for room",
            registry=registry,
        )
        self._bytes = Counter(
            "tfscache_downloaded_bytes",
            "bytes of model versions downloaded from the bucket",
            registry=registry,
        )
        self._seconds = Histogram(
            "tfscache_download_duration_seconds",
            "whole-version downloads from the bucket",
            buckets=DOWNLOAD_BUCKETS,
            registry=registry,
        )

    def hit(self) -> None:
        self._hits.inc()

    def miss(self) -> None:
        self._misses.inc()

    def downloaded(self, seconds: float, size: int) -> None:
        self._seconds.observe(seconds)
        self._bytes.inc(size)

    def evicted(self, size: int) -> None:
        self._evictions.inc()
        self._evicted.inc(size)

    def watch(self, tier) -> None:
        """Gauges of ``tier`` (a ``tfscache.storage.tier.DiskTier``), read at each scrape."""
        self.registry.register(_TierGauges(tier))


class _TierGauges:
    def __init__(self, tier) -> None:
        self._tier = tier

    def collect(self):
        tier = self._tier
        for name, doc, value in (
            (
                "tfscache_disk_tier_bytes",
                "bytes the disk tier holds (downloads in progress included)",
                tier.used_bytes,
            ),
            (
                "tfscache_disk_tier_cap_bytes",
                "the disk tier's cap (storage.cache_bytes)",
                tier.cap_bytes,
            ),
            (
                "tfscache_disk_tier_versions",
                "complete model versions in the disk tier",
                len(tier.resident()),
            ),
            (
                "tfscache_disk_tier_downloads_in_flight",
                "versions being downloaded now",
                tier.downloads_in_flight,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
