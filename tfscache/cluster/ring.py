"""Consistent-hash ring over nodes: each model name maps to N distinct nodes in ring order.

uhashring places ``vnodes`` points per node on a ketama continuum, so adding or
removing one of N nodes moves about 1/N of the names, and only names that hashed
next to the moved points. ``replicas(name)`` walks the continuum clockwise from the
name's hash and returns the first N distinct nodes: the first is the model's home,
the others take it when the home is down or the model is already resident there.
"""

from __future__ import annotations

from collections.abc import Iterable

from uhashring import HashRing


class Ring:
    """Model name -> ``replicas`` distinct node names, stable under membership changes."""

    def __init__(self, nodes: Iterable[str] = (), *, replicas: int = 1, vnodes: int = 160) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.replicas = replicas
        self.vnodes = vnodes
        self._ring = HashRing(nodes={})
        self._cache: dict[str, tuple[str, ...]] = {}
        self._orders: dict[tuple[str, int], tuple[str, ...]] = {}
        for node in nodes:
            self.add(node)

    @property
    def nodes(self) -> list[str]:
        """Node names on the ring, sorted."""
        return sorted(self._ring.get_nodes())

    def add(self, node: str) -> None:
        """Put a node on the ring (no-op when present)."""
        if node not in self._ring.get_nodes():
            self._ring.add_node(node, {"vnodes": self.vnodes})
            self._cache.clear()
            self._orders.clear()

    def remove(self, node: str) -> None:
        """Take a node off the ring (no-op when absent)."""
        if node in self._ring.get_nodes():
            self._ring.remove_node(node)
            self._cache.clear()
            self._orders.clear()

    def replicas_for(self, name: str) -> tuple[str, ...]:
        """The first ``replicas`` distinct nodes clockwise from ``name``'s hash (fewer if the ring
        is small)."""
        cached = self._cache.get(name)
        if cached is None:
            if not self._ring.get_nodes():
                return ()
            size = min(self.replicas, len(self._ring.get_nodes()))
            cached = tuple(conf["nodename"] for conf in self._ring.range(name, size=size))
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[name] = cached
        return cached

    def owner(self, name: str) -> str | None:
        """The model's home node (first replica), or None on an empty ring."""
        replicas = self.replicas_for(name)
        return replicas[0] if replicas else None

    def order(self, name: str, count: int | None = None) -> tuple[str, ...]:
        """The first ``count`` (default: every) distinct nodes clockwise from ``name``'s hash: where
        its copies go, in order (``replicas_for`` is its first ``replicas``)."""
        nodes = self._ring.get_nodes()
        if not nodes:
            return ()
        size = len(nodes) if count is None else min(count, len(nodes))
        if size <= self.replicas:
            return self.replicas_for(name)[:size]
        cached = self._orders.get((name, size))
        if cached is None:
            if len(self._orders) > 100_000:
                self._orders.clear()
            cached = self._orders[(name, size)] = tuple(
                conf["nodename"] for conf in self._ring.range(name, size=size)
            )
        return cached
