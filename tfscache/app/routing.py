"""The router of one `tfscache serve` over its topology, and copies that follow load
(docs/copies.md; without [copies] enabled, fixed replicas)."""

from __future__ import annotations

import asyncio

from tfscache.cluster.copymetrics import CopiesCollector
from tfscache.cluster.spread import Spread, rule_from
from tfscache.cluster.topology import Topology
from tfscache.frontend.router import Router
from tfscache.observe.metrics import Metrics
from tfscache.repository.local import ModelRepository
from tfscache.settings import Settings


def spread_from(settings: Settings) -> Spread | None:
    """The copies rule of [copies], or None (fixed replicas)."""
    if not settings.copies.enabled:
        return None
    return Spread(rule_from(settings.copies, settings.ring), sweep_s=settings.copies.sweep_s)


class Routing:
    """``start()`` builds the router, which follows every change of the topology from then on."""

    def __init__(self, topology: Topology, spread: Spread | None, metrics: Metrics, *,
                 wait_s: float, per_model: bool) -> None:
        self._topology = topology
        self._spread = spread
        self._metrics = metrics
        self._wait_s = wait_s  # cache.load_timeout_s: how long a request waits for a load
        self.router: Router | None = None
        self._sweeper: asyncio.Task | None = None
        if spread is not None:
            spread.watch(lambda: {node.name: node for node in topology.nodes()},
                         lambda: topology.ring)
            metrics.registry.register(CopiesCollector(spread, per_model))

    def start(self, repository: ModelRepository) -> Router:
        topology = self._topology
        self.router = Router(topology.ring, topology.backends, local=topology.own,
                             repository=repository, wait_s=self._wait_s, metrics=self._metrics,
                             spread=self._spread)
        self.router.host_tier = topology.host_tier
        topology.bind(self.router)
        if self._spread is not None:
            self._sweeper = asyncio.create_task(self._spread.run(), name="tfscache-copies-sweep")
        return self.router

    def stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def close(self) -> None:
        """Our connections to the nodes go first: a node (tritonserver) waits for open HTTP
        connections before it exits."""
        if self.router is not None:
            await self.router.close()
