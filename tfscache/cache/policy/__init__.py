"""Eviction policies: which idle models to unload first when a node needs room.

A policy is plain bookkeeping with no asyncio and no node, so the cache manager and
a trace simulator drive the same code. The cache manager tells it about loads,
accesses and unloads, and asks it to order the idle candidates when room is needed;
it never asks about a model with a lease (those are not candidates).

Keys are opaque hashables (the cache uses ``(name, version)``); ``now`` is any
monotonic clock in seconds, supplied by the caller so a simulator can replay time.
Policies are picked by name from ``POLICIES``; ``auto`` (the setting's default) is ``gdsf``
when the node has a memory cap and ``lru`` otherwise (docs/policy.md has the figures).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from typing import Any

from tfscache.importer import load

Key = Hashable


class EvictionPolicy(ABC):
    """Orders eviction candidates. Implementations keep O(1) work per access."""

    name: str = ""

    @abstractmethod
    def record_load(self, key: Key, size_bytes: int, load_seconds: float, now: float) -> None:
        """``key`` became resident, taking ``size_bytes`` and ``load_seconds`` to load.

        Also called again when a better size measurement arrives for a resident key.
        """

    @abstractmethod
    def record_access(self, key: Key, now: float) -> None:
        """A request used resident ``key`` at ``now``."""

    @abstractmethod
    def forget(self, key: Key) -> None:
        """``key`` is no longer resident (unloaded, failed, or dropped)."""

    @abstractmethod
    def victims(self, candidates: Iterable[Key], now: float) -> Iterable[Key]:
        """``candidates`` (resident, idle) in the order they should be evicted."""

    def colder_than(self, candidates: Iterable[Key], key: Key, now: float) -> list[Key]:
        """The ``candidates`` (resident, idle) this policy would evict before ``key`` were ``key``
        loaded and requested at ``now``, in eviction order: what a prefetch of ``key`` may take
        (tfscache.cache.planner.plan_prefetch). The default, none, lets a prefetch take free room only.
        """
        return []

    def set_caps(self, max_models: int, memory_bytes: int) -> None:
        """The node's caps (0: none), told before any load; for policies that price room."""

    @classmethod
    def from_settings(cls, section: Any) -> EvictionPolicy:
        """A new policy configured from the settings' cache section (here: its defaults)."""
        return cls()


# name -> "module:Class"; imported only when chosen.
POLICIES: dict[str, str] = {
    "lru": "tfscache.cache.policy.lru:LRUPolicy",
    "fifo": "tfscache.cache.policy.fifo:FIFOPolicy",
    "lfu": "tfscache.cache.policy.lfu:LFUPolicy",
    "cost": "tfscache.cache.policy.cost:CostAwarePolicy",
    "oldest": "tfscache.cache.policy.oldest:OldestPolicy",
    "gdsf": "tfscache.cache.policy.gdsf:GDSFPolicy",
}

AUTO = "auto"
"""Not a policy: ``gdsf`` under a memory cap (where it wins, docs/policy.md), else ``lru``."""


def resolve(name: str, memory_bytes: int) -> str:
    """The policy ``name`` stands for on a node with a memory cap of ``memory_bytes`` (0: none)."""
    if name != AUTO:
        return name
    return "gdsf" if memory_bytes else "lru"


def make_policy(name: str = "lru", section: Any = None) -> EvictionPolicy:
    """A new policy by its name in ``POLICIES`` (or ``auto``), configured from the cache ``section`` if given.

    ValueError names the known ones.
    """
    name = resolve(name, section.memory_per_node if section is not None else 0)
    cls = load(POLICIES, name, "eviction policy")
    return cls() if section is None else cls.from_settings(section)
