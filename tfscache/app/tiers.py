"""Host-tier nodes for one `tfscache serve` (docs/tiers.md, "Host-tier nodes"): the ``Across``
the caches hand their demotions and promotions to (tfscache.cache.across), over the topology:
local host-tier nodes (embedded), or host-tier peer sidecars (sidecar mode, through their Take
method, tfscache.frontend.tiers).

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
from tfscache.frontend.backends import Backend, NodeBackend, PeerBackend
from tfscache.frontend.tiers import take_on


class HostTier:
    """The nodes of each tier, as the caches of one serve see them (``tfscache.cache.across``):
    local nodes (embedded) and, in sidecar mode, peer sidecars announced with their tier."""

    def __init__(self, topology: Topology, load_timeout_s: float) -> None:
        """``load_timeout_s``: how long a peer's hand-off without a deadline may take here."""
        self._topology = topology
        self._load_timeout_s = load_timeout_s

    def available(self, tier: str) -> bool:
        return any(self._others(tier))

    def _others(self, tier: str) -> list[Backend]:
        """The usable nodes of ``tier`` other than a sidecar's own."""
        topology = self._topology
        nodes = topology.host_tier() if tier == HOST else [
            topology.backends.get(n) for n in topology.ring.nodes]
        return [b for b in nodes if _usable(b) and b.name != topology.own]

    def targets(self, name: str, tier: str) -> list[Backend]:
        """The nodes of ``tier`` that may take model ``name``, best first."""
        topology = self._topology
        if tier == HOST:
            order = topology.host_tier_for(name)
        else:
            order = [topology.backends.get(n) for n in topology.ring.replicas_for(name)]
        return [b for b in order if _usable(b) and b.name != topology.own]

    async def hand_off(self, key: Key, tier: str, timeout: float) -> str:
        name, version = key
        targets = self.targets(name, tier)
        if not targets:
            raise errors.NodeUnavailable(
                f"no healthy {tier}-tier node to move model {name} version {version} to")
        target = targets[0]
        if isinstance(target, PeerBackend):  # another sidecar's node
            node = await take_on(target, name, version, timeout)
            if tier == HOST:
                target.holding.add(name)  # requests for it go there until taken back
            return node
        await target.cache.take(name, version, timeout)
        return target.name

    async def taken(self, name: str, version: int, timeout: float | None) -> str:
        """Sidecar mode: a peer hands ``(name, version)`` to this sidecar's own node (its Take,
        tfscache.frontend.tiers); no host-tier peer is sent its requests any longer."""
        own = self._topology.node(self._topology.own)
        if own is None or own.cache is None:
            raise errors.NodeUnavailable(f"sidecar {self._topology.own} has no node attached yet")
        for peer in self._topology.host_tier():
            if isinstance(peer, PeerBackend):
                peer.holding.discard(name)
        await own.cache.take(name, version, self._load_timeout_s if timeout is None else timeout)
        return own.name


def _usable(backend: Backend | None) -> bool:
    if backend is None:
        return False
    if isinstance(backend, NodeBackend):
        return backend.cache is not None and bool(backend.healthy)
    return bool(backend.healthy)
