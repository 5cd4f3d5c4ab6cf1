"""A load batch's memory, measured: the node's growth across it, shared by each version's estimate."""

from __future__ import annotations

from tfscache.cache.ledger import Entry, Ledger
from tfscache.cache.planner import Caps


def measure(
    loaded: list[Entry], before: int | None, after: int | None, caps: Caps, ledger: Ledger
) -> None:
    """Share the node's memory growth across the batch by estimate, never below the size on disk.

    Memory can grow by less than a model takes when the allocator reuses memory an
    eviction freed; the size on disk is a floor no SavedModel's variables go under.
    """
    if before is None or after is None or not loaded:
        return
    growth = after - before
    total = sum(e.bytes for e in loaded) or 1
    for entry in loaded:
        size = max(int(growth * entry.bytes / total), entry.disk, 1)
        if caps.memory_bytes:
            size = min(size, caps.memory_bytes)  # see CacheManager._estimate
        ledger.measured(entry.key, size)
