"""Host-tier nodes for one `tfscache serve` (docs/tiers.md, "Host-tier nodes"): the ``Across``
the caches hand their demotions and promotions to (tfscache.cache.across), over the topology.

A demoted version goes to one host-tier node, the same each time for a name (hashed over the
host tier's names, skipping those not healthy); a promoted one goes back to its first healthy
node on the ring, where the router sends its cold requests. Each hand-off is a load through the
target's own cache (``CacheManager.take``): its caps, its policy and its waits apply.
"""

from __future__ import annotations

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.cache.tiers import HOST
from tfscache.cluster.topology import Topology
from tfscache.frontend.backends import NodeBackend


class HostTier:
    """The nodes of each tier, as the caches of one serve see them (``tfscache.cache.across``)."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    def available(self, tier: str) -> bool:
        nodes = self._topology.host_tier() if tier == HOST else [
            self._topology.node(n) for n in self._topology.ring.nodes]
        return any(_usable(b) for b in nodes)

    def targets(self, name: str, tier: str) -> list[NodeBackend]:
        """The nodes of ``tier`` that may take model ``name``, best first."""
        topology = self._topology
        if tier == HOST:
            order = topology.host_tier_for(name)
        else:
            order = [topology.node(n) for n in topology.ring.replicas_for(name)]
        return [b for b in order if _usable(b)]

    async def hand_off(self, key: Key, tier: str, timeout: float) -> str:
        name, version = key
        targets = self.targets(name, tier)
        if not targets:
            raise errors.NodeUnavailable(
                f"no healthy {tier}-tier node to move model {name} version {version} to")
        target = targets[0]
        await target.cache.take(name, version, timeout)
        return target.name


def _usable(backend: NodeBackend | None) -> bool:
    return backend is not None and backend.cache is not None and bool(backend.healthy)
