"""A stand-in for a node's ``CacheManager`` (tfscache/cache/manager.py), for tests of what reads
or drives a cache from outside: routing, metrics, ``/status``, Spread's sweep.

    cache = FakeCache([resident("a", leases=2), resident("b", state="loading")], queued=1)
    NodeBackend("node0", upstream, cache)

It has CacheManager's names and signatures, and no loading: ``acquire`` hands out a lease at
once (and records the call), ``evict`` drops an idle model and refuses a leased or pinned one
with FailedPrecondition, as the real one does. A test changes what it needs by assignment
(``cache.healthy = False``, ``cache.acquire = refuse``).
"""

from __future__ import annotations

import contextlib

from tfscache import errors
from tfscache.cache.ledger import QueuedLoad, ResidentModel
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.settings import CacheSection


def resident(name: str, version: int = 1, size: int = 100, *, leases: int = 0,
             state: str = "available", pinned: bool = False, measured: bool = True,
             last_use: float = 0.0, tier: str = "gpu") -> ResidentModel:
    """One entry of ``snapshot()``."""
    return ResidentModel(name, version, size, measured, leases, last_use, state, pinned, tier)


class FakeLease(contextlib.AbstractAsyncContextManager):
    """What ``acquire`` returns: released on leaving ``async with`` or by ``release()``."""

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True

    async def __aexit__(self, *exc) -> None:
        self.release()


class FakeCache:
    """A node's cache holding ``models``, with ``queued`` cold loads waiting, under the caps
    ``max_models`` and ``memory_bytes`` (0: none)."""

    lost_texts = TFServingAdapter.lost_texts  # the node kind's words for a lost model
    prefetch_counts = None  # prefetch off (docs/prefetch.md)

    def __init__(self, models: list[ResidentModel] | None = None, *, queued: int = 0,
                 max_models: int = 0, memory_bytes: int = 0) -> None:
        self.models = list(models or [])
        self.queued = queued
        self.settings = CacheSection(max_models_per_node=max_models, memory_per_node=memory_bytes)
        self.healthy = True
        self.draining = False
        self.acquired: list[tuple[str, int | None, float | None]] = []  # acquire's arguments
        self.evicted: list[str] = []  # the names evict dropped
        self.gpu_reading = (0, 0)  # gpu_usage(): (GPU bytes, GPU cap); no GPU cap by default

    def snapshot(self) -> list[ResidentModel]:
        return list(self.models)

    def gpu_usage(self) -> tuple[int, int]:
        return self.gpu_reading

    def queue(self) -> list[QueuedLoad]:
        return [QueuedLoad(f"queued{i}", 1, 1, 0, False) for i in range(self.queued)]

    def is_resident(self, name: str, version: int | None = None) -> bool:
        return any(m.name == name and version in (None, m.version) and m.state == "available"
                   for m in self.models)

    async def wait_ready(self, timeout: float | None) -> bool:
        return True

    async def acquire(self, name: str, version: int | None = None,
                      timeout: float | None = None) -> FakeLease:
        self.acquired.append((name, version, timeout))
        return FakeLease()

    async def evict(self, name: str, version: int | None = None) -> list[tuple[str, int]]:
        chosen = [m for m in self.models if m.name == name and version in (None, m.version)]
        if any(m.leases or m.pinned for m in chosen):
            raise errors.FailedPrecondition(f"not evicting {name}")
        self.models = [m for m in self.models if m not in chosen]
        self.evicted += [m.name for m in chosen]
        return [(m.name, m.version) for m in chosen]
