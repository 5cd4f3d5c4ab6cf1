"""What a node's cache reports as it works (tfscache.observe.metrics counts it), and the one
report of each eviction (``Evictions``: its log line and event)."""

from __future__ import annotations

import logging
import time

from tfscache.cache.ledger import Key, Ledger
from tfscache.cache.prefetch import PrefetchCounts

log = logging.getLogger("tfscache.cache")


class CacheEvents:
    """What a CacheManager reports as it works; these do nothing (tfscache.observe.metrics counts
    them).

    Called synchronously on the event loop: implementations must not block or raise.
    """

    def hit(self, key: Key) -> None:
        """An acquire found ``key`` resident."""

    def miss(self, key: Key) -> None:
        """An acquire had to wait for ``key``'s load (or was refused it)."""

    def prefetch_used(self, key: Key) -> None:
        """The running request is the first for ``key`` since a prefetch loaded it (in its task)."""

    def loaded(self, key: Key, seconds: float, size: int, measured: bool) -> None:
        """``key`` is AVAILABLE after a reload of ``seconds``; ``size`` bytes (measured or
        estimated)."""

    def load_failed(self, key: Key, seconds: float, error: Exception) -> None:
        """Loading ``key`` failed with ``error``."""

    def room_waited(self, key: Key, seconds: float) -> None:
        """``key``'s load waited ``seconds`` for room under the caps (admitted, or timed out)."""

    def evicted(self, key: Key, reason: str, size: int) -> None:
        """``key`` leaves the node's config: capacity, vanished, node_lost, ..."""

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        """The node reported END for ``key``, ``seconds`` after its config went out."""

    def moved(self, key: Key, tier: str, seconds: float) -> None:
        """``key`` moved to ``tier`` (``host``: demoted, ``gpu``: promoted) in ``seconds``."""

    def move_failed(self, key: Key, tier: str, error: Exception) -> None:
        """Moving ``key`` to ``tier`` failed with ``error``; it stays where it was."""


class Evictions:
    """The evictions of one node, each reported once: a log line and ``CacheEvents.evicted``
    (the unload's line follows once the node confirms). The reloader's (capacity, prefetch,
    admin, drain, vanished) and its recovery's (node_lost) alike."""

    def __init__(self, node: str, ledger: Ledger, events: CacheEvents,
                 prefetched: PrefetchCounts | None) -> None:
        """``prefetched``: the prefetch counts (prefetch on); a prefetched version evicted before
        any request used it counts as wasted."""
        self._node, self._ledger, self._events, self._prefetched = node, ledger, events, prefetched

    def evicted(self, key: Key, reason: str) -> None:
        """Report that ``key``, still in the ledger, leaves the node for ``reason``."""
        entry = self._ledger.entries[key]
        if entry.prefetched:  # prefetched, never requested: wasted
            self._prefetched.count("wasted")
        idle_s = max(0.0, time.time() - entry.last_use)
        log.info("node %s: evicting %s version %s (%s; %d bytes, idle %.1f s)", self._node, key[0],
                 key[1], reason, entry.bytes, idle_s,
                 extra={"model": key[0], "version": key[1], "node": self._node, "reason": reason,
                        "bytes": entry.bytes, "idle_s": round(idle_s, 3)})
        self._events.evicted(key, reason, entry.bytes)
