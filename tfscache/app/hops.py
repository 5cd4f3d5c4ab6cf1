"""The hops of one `tfscache serve` to its nodes and to other sidecars: one HTTP session, and
upstreams sized by [server] (frontend/upstream.py)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from tfscache.app.credentials import Credentials
from tfscache.discovery import Peer
from tfscache.frontend.backends import PeerBackend
from tfscache.frontend.upstream import Upstream, http_session
from tfscache.settings.sections import ServerSection
from tfscache.tls import PeerTls


class Hops:
    """``own``: the sidecar's own name (None embedded); ``on_load(name, load)``: what a peer
    reports of its own node's load (``Copies.report``; None: not asked)."""

    def __init__(self, server: ServerSection, credentials: Credentials, own: str | None,
                 on_load: Callable[[str, float], None] | None = None) -> None:
        self._server = server
        self._credentials = credentials
        self._own = own
        self._on_load = on_load
        self._http: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._http = http_session()

    def upstream(self, grpc_address: str, rest_address: str | None, tls: PeerTls | None = None,
                 keepalive: bool = False) -> Upstream:
        """The hop to a node (or, with ``tls`` and ``keepalive``, a peer)."""
        # The hop to a node carries what the client may send and what the node may answer.
        return Upstream(grpc_address, rest_address, self._http,
                        max_send_bytes=self._server.max_receive_message_bytes,
                        max_receive_bytes=self._server.max_send_message_bytes, tls=tls,
                        keepalive=keepalive)

    def peer(self, peer: Peer) -> PeerBackend:
        """A backend for another sidecar's front end (Topology.set_peers makes one per new peer)."""
        upstream = self.upstream(peer.grpc, peer.rest or None, self._credentials.peer,
                                 keepalive=True)
        return PeerBackend(peer.name, upstream, self._own, on_load=self._on_load)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
