"""Sidecar mode: membership of the ring through discovery (docs/discovery.md, "Wiring into
`tfscache serve`"): followed into the topology, registered with, left first at stop."""

from __future__ import annotations

import asyncio
import logging

from tfscache import errors
from tfscache.cluster.topology import Topology
from tfscache.discovery import Discovery, advertise_peer, from_settings
from tfscache.discovery.table import BACKENDS
from tfscache.settings import Settings
from tfscache.settings.sections import DiscoverySection

log = logging.getLogger("tfscache.app")


def in_ring_at_start(discovery: DiscoverySection) -> bool:
    """Whether a sidecar's own node is on its ring from the start: once joined (or joining at
    start-up); discovery.join = false keeps it out until join(), with a backend that registers
    (consul, etcd); the others (static, dns) ignore that setting."""
    return discovery.join or not BACKENDS[discovery.backend].registers


class Membership:
    """The discovery backend, from ``start()`` (sidecar mode) until ``stop()``."""

    def __init__(self, settings: Settings, config_file: str | None, topology: Topology) -> None:
        self._settings = settings
        self._config_file = config_file  # the static backend re-reads it on SIGHUP
        self._topology = topology
        self.discovery: Discovery | None = None
        self.joined = False  # registered with discovery
        self._join_lock = asyncio.Lock()

    async def start(self) -> None:
        """Follow the membership: its changes (and SIGHUP's re-read peers file) go to the
        topology."""
        self.discovery = from_settings(self._settings, self._config_file)
        await self.discovery.start()
        self._topology.set_peers(self.discovery.members())
        self.discovery.subscribe(self._topology.set_peers)

    async def join(self, grpc_port: int | None, rest_port: int | None) -> tuple[bool, str]:
        """Register with discovery now, advertising these ports, and go on the own ring
        (idempotent; ``ServeApp.join``)."""
        own = self._topology.own
        if own is None:
            raise errors.FailedPrecondition("join: this tfscache is not in sidecar mode (no "
                                            "node.node_address); it has no discovery to join")
        async with self._join_lock:
            if self.discovery is None:
                raise errors.FailedPrecondition("join: this sidecar is stopping; it has left "
                                                "discovery")
            static = bool(self.discovery.registration_note)  # static, dns: nothing to register
            if not self.joined:
                await self.discovery.register(advertise_peer(self._settings, grpc_port, rest_port))
                self.joined = True
            elif not static:
                return False, f"{own} is already registered with {self.discovery.name} discovery"
            if static:
                return False, self.discovery.registration_note
            self._topology.join()
            log.info("joined: registered %s with %s discovery", own, self.discovery.name)
            return True, f"{own} registered with {self.discovery.name} discovery"

    async def leave(self) -> None:
        """Deregister (the drain's first step, and SIGTERM's); stop() then stops discovery."""
        if self.discovery is not None:
            await self.discovery.deregister()

    async def stop(self) -> None:
        """Leave the ring (first, before the drain) and stop following it."""
        if self.discovery is not None:
            await self.discovery.deregister()
            await self.discovery.stop()
            self.discovery = None
