"""Admin operations over one ``tfscache serve`` process: its nodes' caches, by ring name.

Which nodes an operation acts on when the request names none:

* sidecar mode: its one node, always (a prewarm targets a sidecar before the ring
  includes it, so the ring must not decide);
* embedded mode: pin and preload act on the model's replicas on the ring; unpin and
  evict on every local node where the model is pinned or resident.

Errors are the cache's own (``tfscache.errors``): an unknown model is NOT_FOUND with
TF Serving's "Servable not found for request" text, a leased model cannot be evicted
(FAILED_PRECONDITION naming its leases), a load that finds no room is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from collections.abc import Awaitable, Callable

from tfscache import errors
from tfscache.cache.ledger import ResidentModel
from tfscache.cache.manager import CacheManager
from tfscache.repository.local import ModelRepository
from tfscache.cluster.topology import Topology


@dataclass(frozen=True)
class NodeState:
    """One node's cache as ListModels reports it."""

    node: str
    healthy: bool
    draining: bool
    models: list[ResidentModel]
    queued: int


class AdminOperations:
    """The admin operations over a topology's local nodes; no transport (admin/server.py is one).

    ``join`` is the sidecar's ``ServeApp.join`` (register with discovery now).
    """

    def __init__(self, topology: Topology, repository: ModelRepository, *, default_timeout_s: float,
                 join: Callable[[], Awaitable[tuple[bool, str]]] | None = None) -> None:
        self.topology = topology
        self.repository = repository
        self.default_timeout_s = default_timeout_s
        self._join = join

    # -- nodes -------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        """This process's own nodes (not peer sidecars), in name order."""
        return [node.name for node in self.topology.nodes()]

    def cache(self, node: str) -> CacheManager:
        """The cache of local node ``node``: NOT_FOUND if there is none, UNAVAILABLE while it restarts."""
        backend = self.topology.node(node)
        if backend is None:
            raise errors.NotFound(
                f"no node {node!r} in this tfscache; its nodes: {', '.join(self.node_names())}"
            )
        if backend.cache is None:
            raise errors.NodeUnavailable(f"node {node} is not running")
        return backend.cache

    def _load_targets(self, name: str, node: str) -> list[str]:
        if node:
            return [node]
        if self.topology.own is not None:
            return [self.topology.own]
        own = set(self.node_names())
        targets = [n for n in self.topology.ring.replicas_for(name) if n in own]
        if not targets:
            raise errors.NodeUnavailable(f"no node on the ring for model {name}")
        return targets

    def _all_targets(self, node: str) -> list[str]:
        return [node] if node else self.node_names()

    # -- operations --------------------------------------------------------------------

    def list_models(self, node: str = "") -> list[NodeState]:
        states = []
        for name in self._all_targets(node):
            cache = self._optional_cache(name, node)
            if cache is None:  # a restarting node: listed, with nothing resident
                states.append(NodeState(name, False, False, [], 0))
                continue
            models = sorted(cache.snapshot(), key=lambda m: (m.name, m.version))
            states.append(
                NodeState(name, cache.healthy, cache.draining, models, len(cache.queue()))
            )
        return states

    async def preload(self, name: str, version: int | None, node: str = "",
                      timeout_s: float | None = None) -> dict[str, list[ResidentModel]]:
        """Load on each target node and wait until AVAILABLE there (all at once)."""
        return await self._on_load_targets("preload", name, version, node, timeout_s)

    async def pin(self, name: str, version: int | None, node: str = "",
                  timeout_s: float | None = None) -> dict[str, list[ResidentModel]]:
        """Load on each target node if needed and keep it resident there."""
        return await self._on_load_targets("pin", name, version, node, timeout_s)

    async def _on_load_targets(self, operation: str, name: str, version: int | None, node: str,
                               timeout_s: float | None) -> dict[str, list[ResidentModel]]:
        """Run the cache's ``operation`` (preload or pin) on every target node at once."""
        timeout = timeout_s or self.default_timeout_s
        targets = self._load_targets(name, node)
        results = await asyncio.gather(
            *(getattr(self.cache(t), operation)(name, version, timeout) for t in targets)
        )
        return {t: [r] for t, r in zip(targets, results)}

    async def unpin(
        self, name: str, version: int | None, node: str = ""
    ) -> dict[str, list[ResidentModel]]:
        """Unpin where pinned (on disk before it returns); NOT_FOUND when pinned nowhere."""
        done: dict[str, list[ResidentModel]] = {}
        caches = {}
        for target in self._all_targets(node):
            cache = self._optional_cache(target, node)
            if cache is not None and _has(cache, name, version, pinned=True):
                caches[target] = cache
        unpinned = await asyncio.gather(*(cache.unpin(name, version) for cache in caches.values()))
        for (target, cache), keys in zip(caches.items(), unpinned):
            done[target] = [m for m in cache.snapshot() if (m.name, m.version) in keys]
        if not done:
            where = f"node {node}" if node else "any node of this tfscache"
            raise errors.NotFound(f"model {name}{_version(version)} is not pinned on {where}")
        return done

    async def evict(
        self, name: str, version: int | None, node: str = ""
    ) -> dict[str, list[ResidentModel]]:
        """Unload now where resident; every target is checked before any is evicted."""
        caches = {}
        for target in self._all_targets(node):
            cache = self._optional_cache(target, node)
            if cache is not None and _has(cache, name, version):
                caches[target] = cache
        if not caches:
            # NOT_FOUND for an unknown model first, in the node kind's words (a node's cache
            # lists the repository off the event loop)
            await self._on_disk(name, version, node)
            where = f"node {node}" if node else "any node of this tfscache"
            raise errors.NotFound(f"model {name}{_version(version)} is not resident on {where}")
        before = {
            t: [
                dataclasses.replace(m, state="unloaded", leases=0)
                for m in c.snapshot()
                if m.name == name and version in (None, m.version)
            ]
            for t, c in caches.items()
        }
        _check_evictable(caches, name, version)
        await asyncio.gather(*(c.evict(name, version) for c in caches.values()))
        return before

    async def join(self) -> tuple[bool, str]:
        """Sidecar mode: register with discovery now (``ServeApp.join``); FailedPrecondition otherwise."""
        join = self._join
        if join is None or self.topology.own is None:
            raise errors.FailedPrecondition(
                "join: this tfscache is not in sidecar mode (no node.node_address); "
                "it has no discovery to join"
            )
        from tfscache.discovery import DiscoveryError

        try:
            return await join()
        except DiscoveryError as exc:  # the registry did not take the registration: try again later
            raise errors.Unavailable(f"join: {exc}") from exc

    async def _on_disk(self, name: str, version: int | None, node: str) -> None:
        """NOT_FOUND unless the repository has ``name`` (at ``version``), as a node's cache
        words it; the repository's own words while no local node is running."""
        for target in self._all_targets(node):
            cache = self._optional_cache(target, node)
            if cache is not None:
                await cache.version_on_disk(name, version)
                return
        await asyncio.to_thread(self.repository.resolve, name, version)

    def _optional_cache(self, target: str, node: str) -> CacheManager | None:
        if node:
            return self.cache(node)
        return self.topology.node(target).cache


def _has(cache: CacheManager, name: str, version: int | None, *, pinned: bool = False) -> bool:
    return any(m.name == name and version in (None, m.version) and m.state != "unloading"
               and (m.pinned or not pinned) for m in cache.snapshot())


def _check_evictable(caches: dict[str, CacheManager], name: str, version: int | None) -> None:
    """FAILED_PRECONDITION before anything is unloaded, naming every lease and pin in the way."""
    problems = []
    for target, cache in caches.items():
        for m in cache.snapshot():
            if m.name != name or version not in (None, m.version) or m.state == "unloading":
                continue
            if m.leases:
                problems.append(
                    f"model {m.name} version {m.version} is held by {m.leases} "
                    f"lease{'s' if m.leases != 1 else ''} (requests in flight) on node {target}"
                )
            elif m.state == "loading":
                problems.append(f"model {m.name} version {m.version} is loading on node {target}")
            elif m.pinned:
                problems.append(
                    f"model {m.name} version {m.version} is pinned on node {target} (unpin it first)"
                )
    if problems:
        raise errors.FailedPrecondition("not evicted: " + "; ".join(problems))


def _version(version: int | None) -> str:
    return "" if version is None else f" version {version}"
