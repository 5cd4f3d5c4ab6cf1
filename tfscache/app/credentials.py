"""[tls] of one `tfscache serve` (docs/tls.md): the front ends' certificate and, in sidecar mode,
the hop to peers; read at start, read again on SIGHUP without closing a listener."""

from __future__ import annotations

import asyncio

from tfscache.settings.sections import TlsSection
from tfscache.tls import PeerTls, ServerTls


class Credentials:
    """``server`` and ``peer`` stay None without ``tls.cert_file`` (``server`` also when the front
    ends here do not face clients: with ``server.data_plane = haproxy`` HAProxy terminates TLS,
    tfscache.dataplane.certs; ``peer`` outside sidecar mode)."""

    def __init__(self, tls: TlsSection, sidecar: bool, front_ends: bool = True) -> None:
        self._tls = tls
        self._sidecar = sidecar
        self._front_ends = front_ends
        self.server: ServerTls | None = None
        self.peer: PeerTls | None = None

    async def load(self) -> None:
        if self._tls.cert_file:
            if self._front_ends:
                self.server = await asyncio.to_thread(ServerTls, self._tls)
            self.peer = await asyncio.to_thread(PeerTls, self._tls) if self._sidecar else None

    async def reload(self) -> None:
        """New connections get the files as they are now."""
        for credentials in (self.server, self.peer):
            if credentials is not None:
                await credentials.reload()
