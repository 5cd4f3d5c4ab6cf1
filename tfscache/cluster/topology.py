"""Who serves: the backends of one ``tfscache serve``, the ring over them, joined and drained nodes.

``Topology`` is the one owner of that state and the only code that builds a ``Ring``.
Every change goes through one of its methods: discovery's membership and SIGHUP's
re-read peers file (``set_peers``), a drain (``drain``/``restore``), ``join`` (a sidecar
started with ``discovery.join = false`` going on its own ring). Each rebuilds the ring
from ``ring_nodes`` (pure: which names go on it) and hands the router the new ring and
backends together, with no await in between: a request sees the old pair or the new one.

    topology = Topology(replicas=2, vnodes=160, own="a", in_ring=False, make_peer=make)
    topology.set_nodes([NodeBackend("a")])          # local nodes, once, at start-up
    router = Router(topology.ring, topology.backends, local="a")
    topology.bind(router)                           # every later change reaches it
    topology.set_peers(discovery.members())         # a peer gone is retired: closed once idle
    topology.drain("a")                             # off the ring, even when discovery reports it again
    await topology.close()                          # retiring peers closed at once

Ring rules (``ring_nodes``): a drained node is never on it. A sidecar's own node is on
its ring only while it is in the ring (joined; ``discovery.join = false`` keeps it out
until ``join``) and not drained, so requests through it go where every other sidecar
sends them; but it is there whenever nobody else is, as there is nowhere else to go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from tfscache import errors
from tfscache.frontend.backends import Backend, NodeBackend, PeerBackend
from tfscache.cluster.ring import Ring
from tfscache.tasks import cancel

if TYPE_CHECKING:
    from tfscache.discovery import Peer

log = logging.getLogger("tfscache.cluster.topology")


class Routes(Protocol):
    """What the topology updates: the router (``tfscache.frontend.router.Router``)."""

    def update(self, ring: Ring, backends: Mapping[str, Backend]) -> None: ...


def ring_nodes(
    names: Iterable[str], *, own: str | None, in_ring: bool, drained: Iterable[str]
) -> list[str]:
    """The names that go on the ring (sorted): see the module docstring's ring rules."""
    drained = set(drained)
    names = list(names)
    others = sorted(n for n in names if n != own and n not in drained)
    if own is None or own not in names:
        return others
    if (in_ring and own not in drained) or not others:
        return sorted([own, *others])
    return others


class Topology:
    """The backends (name -> Backend), the ring over them, joined and drained nodes."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        vnodes: int = 160,
        own: str | None = None,
        in_ring: bool = True,
        make_peer: Callable[[Peer], PeerBackend] | None = None,
        retire_grace_s: float = 600.0,
        own_tier: str = "gpu",
    ) -> None:
        # sidecar mode: the name of its one node (and of this sidecar); None: embedded
        self.own = own
        self._own_tier = own_tier  # sidecar mode: its node's tier ("host": off the ring)
        self._replicas, self._vnodes = replicas, vnodes
        self._in_ring = in_ring or own is None
        self._make_peer = make_peer
        self._retire_grace_s = retire_grace_s
        self._nodes: dict[str, NodeBackend] = {}  # local nodes, fixed at start-up
        # local host-tier nodes (docs/tiers.md): backends, never on the ring
        self._host_tier: tuple[str, ...] = ()
        # every host-tier name (local nodes, peers, its own node), and a ring over them: where
        # a demoted model goes
        self._hosts: tuple[str, ...] = ()
        self._host_ring = Ring()
        # the peer each PeerBackend was made for
        self._peers: dict[str, tuple[Peer, PeerBackend]] = {}
        self._drained: set[str] = set()
        self._backends: Mapping[str, Backend] = MappingProxyType({})
        self._ring = Ring(replicas=replicas, vnodes=vnodes)
        self._router: Routes | None = None
        # peers off the ring, closing once idle
        self._retiring: dict[asyncio.Task, PeerBackend] = {}

    # -- reading -------------------------------------------------------------------------

    @property
    def ring(self) -> Ring:
        return self._ring

    @property
    def backends(self) -> Mapping[str, Backend]:
        """Every backend by ring name, local nodes and peers (read-only; replaced on each change)."""
        return self._backends

    @property
    def in_ring(self) -> bool:
        """Sidecar mode: whether its own node goes on its ring (joined, or joining at start-up)."""
        return self._in_ring

    @property
    def drained(self) -> frozenset[str]:
        return frozenset(self._drained)

    def nodes(self) -> list[NodeBackend]:
        """This process's own nodes (not peer sidecars), in name order."""
        return [self._nodes[name] for name in sorted(self._nodes)]

    def peers(self) -> dict[str, PeerBackend]:
        """Sidecar mode: the other sidecars' backends by name, as discovery last reported them."""
        return {name: backend for name, (_, backend) in self._peers.items()}

    def host_tier(self) -> list[Backend]:
        """The host-tier nodes, in name order: local ones and peer sidecars announced as
        ``host``, off the ring; they hold what the GPU-tier nodes demoted (docs/tiers.md)."""
        return [self._backends[name] for name in self._hosts if name in self._backends]

    def host_tier_for(self, model: str) -> list[Backend]:
        """The host-tier nodes in the order model ``model`` tries them (hashed over their names:
        the same node each time while it is there)."""
        return [self._backends[name] for name in self._host_ring.replicas_for(model)
                if name in self._backends]

    def node(self, name: str) -> NodeBackend | None:
        """Local node ``name``, or None when there is none (a peer's name included)."""
        return self._nodes.get(name)

    def serving(self) -> bool:
        """Whether requests can be served: a ring with nodes and a healthy node of its own (sidecar:
        its one node; embedded: any)."""
        if not self._ring.nodes:
            return False
        if self.own is not None:
            node = self._nodes.get(self.own)
            return node is not None and bool(node.healthy)
        return any(node.healthy for node in self._nodes.values())

    # -- changing ------------------------------------------------------------------------

    def bind(self, router: Routes) -> None:
        """Send every change from now on to ``router`` (and the current ring and backends at once)."""
        self._router = router
        router.update(self._ring, self._backends)

    def set_nodes(self, nodes: Iterable[NodeBackend], host_tier: Iterable[str] = ()) -> None:
        """The local nodes (embedded: the children; sidecar: its one node, named ``own``);
        ``host_tier``: the names of those that are host-tier nodes, kept off the ring."""
        self._nodes = {node.name: node for node in nodes}
        self._host_tier = tuple(sorted(host_tier))
        if self.own is not None and self.own not in self._nodes:
            raise ValueError(f"sidecar {self.own!r} has no node of that name")
        self._publish()

    def set_peers(self, peers: Iterable[Peer]) -> None:
        """Sidecar mode: the sidecars in the membership (this one included or not), replacing the last.

        A peer whose address changed gets a new backend; one gone (or replaced) is retired:
        its channel closes once the requests already sent there have finished. Drained nodes
        stay off the ring whatever the membership says.
        """
        if self.own is None or self._make_peer is None:
            raise ValueError("set_peers: only a sidecar (own name and make_peer) has peers")
        previous = self._peers
        current: dict[str, tuple[Peer, PeerBackend]] = {}
        for peer in peers:
            if peer.name == self.own or peer.name in self._nodes:
                continue
            known = previous.get(peer.name)
            if known is not None and (known[0].grpc, known[0].rest or None, known[0].tier) == (
                peer.grpc,
                peer.rest or None,
                peer.tier,
            ):
                current[peer.name] = known
            else:
                current[peer.name] = (peer, self._make_peer(peer))
        self._peers = current
        self._publish()
        for name, (_, backend) in previous.items():
            if current.get(name, (None, None))[1] is not backend:
                self._retire(name, backend)

    def join(self) -> bool:
        """Sidecar mode: put its own node on its ring; False when it was there already."""
        if self._in_ring:
            return False
        self._in_ring = True
        self._publish()
        return True

    def drain(self, name: str) -> None:
        """Take ``name`` off the ring for good (until ``restore``), whatever discovery reports.

        FailedPrecondition for a node that is the last on the ring (a sidecar's own node
        may be: it stays there until another sidecar is known).
        """
        if name != self.own and name not in self._drained:
            if not [n for n in self._ring.nodes if n != name]:
                raise errors.FailedPrecondition(f"node {name} is the last node on the ring; "
                                                "drain the whole process instead")
        self._drained.add(name)
        self._publish()

    def restore(self, name: str) -> None:
        """Undo ``drain``: ``name`` goes back on the ring (if it is still a backend)."""
        self._drained.discard(name)
        self._publish()

    async def close(self) -> None:
        """Close the peers being retired now, without waiting for their calls (process stop)."""
        for task, backend in list(self._retiring.items()):
            await cancel(task)
            await backend.close()

    # -- the one ring builder -----------------------------------------------------------

    def _publish(self) -> None:
        backends: dict[str, Backend] = dict(self._nodes)
        backends.update((name, backend) for name, (_, backend) in self._peers.items())
        hosts = {*self._host_tier, *(n for n, (peer, _) in self._peers.items()
                                     if peer.tier == "host")}
        if self.own is not None and self._own_tier == "host":
            hosts.add(self.own)
        if tuple(sorted(hosts)) != self._hosts:
            self._hosts = tuple(sorted(hosts))
            self._host_ring = Ring(self._hosts, replicas=max(len(self._hosts), 1),
                                   vnodes=self._vnodes)
        ring = Ring(
            ring_nodes(backends, own=self.own, in_ring=self._in_ring,
                       drained=self._drained.union(hosts)),
            replicas=self._replicas,
            vnodes=self._vnodes,
        )
        # Swapped together, with no await in between: a request sees the old pair or the new one.
        self._ring, self._backends = ring, MappingProxyType(backends)
        if self._router is not None:
            self._router.update(ring, self._backends)
        log.info("ring: %s%s%s", ", ".join(ring.nodes) or "(empty)",
                 f" (drained: {', '.join(sorted(self._drained))})" if self._drained else "",
                 f" (host tier: {', '.join(self._hosts)})" if self._hosts else "")

    def _retire(self, name: str, backend: PeerBackend) -> None:
        task = asyncio.create_task(
            backend.retire(self._retire_grace_s), name=f"tfscache-retire-{name}"
        )
        self._retiring[task] = backend
        task.add_done_callback(lambda t: self._retiring.pop(t, None))
