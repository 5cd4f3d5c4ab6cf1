"""Routing: which backend serves a request, and one retry on UNAVAILABLE.

The ring maps a model name to ``replicas_per_model`` distinct backends. Among them
a healthy one that already holds the model goes first, then the others in ring
order. If the chosen one answers UNAVAILABLE (node down, connection lost, its channel
closed because it left the ring) or CANCELLED (a peer that cancelled the call while
shutting down or draining; our own caller cancelling cancels this task instead), the
best other replica on the ring as it is then is tried, once. A request forwarded by a peer sidecar is served locally and
never routed again, so a request makes at most one extra hop and cannot loop.

A version label is resolved to its version (``label_version``) before routing, as
TF Serving resolves it to ``Specific(NAME, V)``; the transports rewrite the request.
The backend a request goes to is bound to the log context (``node``).
"""

from __future__ import annotations

import logging

from tfscache import errors, logs
from tfscache.frontend.methods import STATUS_PATH, RouteKey, status_not_found
from tfscache.frontend.upstream import RestReply
from tfscache.ring import Ring

log = logging.getLogger("tfscache.frontend.router")


class Router:
    """Picks backends for a RouteKey over the ring and forwards to them."""

    def __init__(self, ring: Ring, backends: dict, local: str | None = None, repository=None) -> None:
        self.ring = ring
        self.backends = backends  # ring node name -> NodeBackend | PeerBackend
        self.local = local  # sidecar mode: the name of this sidecar's own node
        self.repository = repository  # tfscache.repository.ModelRepository: version labels

    def label_version(self, name: str, label: str) -> int:
        """The version a label names (the repository's labels.json); TF Serving's errors."""
        if self.repository is None:
            raise errors.InvalidArgument(f"Unrecognized servable version label: {label}")
        return self.repository.label_version(name, label)

    def candidates(self, key: RouteKey | None, forwarded: bool = False) -> list:
        """Backends to try, best first (at most two are ever tried)."""
        if forwarded or (key is None and self.local):
            if self.local is None:
                raise errors.FailedPrecondition("request forwarded to a tfscache that has no node of its own")
            return [self.backends[self.local]]
        if key is None:  # no model named: any healthy node reports TF Serving's error
            nodes = [b for b in self.backends.values() if b.healthy] or list(self.backends.values())
            return nodes[:1]
        replicas = [self.backends[name] for name in self.ring.replicas_for(key.name)]
        if not replicas:
            raise errors.NodeUnavailable("no nodes in the ring")
        # Stable sort keeps ring order within each class.
        return sorted(replicas, key=lambda b: (not b.healthy, b.name != self.local and not b.holds(key)))

    async def grpc(self, path: str, key: RouteKey | None, request: bytes, metadata, deadline: float | None,
                   forwarded: bool = False) -> bytes:
        """Forward a gRPC request's bytes; the response bytes of the serving node."""
        try:
            return await self._grpc(path, key, request, metadata, deadline, forwarded)
        except errors.ModelNotFound as exc:
            if path == STATUS_PATH and key is not None:  # GetModelStatus has its own texts
                raise status_not_found(key) from exc
            raise

    async def _grpc(self, path, key, request, metadata, deadline, forwarded) -> bytes:
        first = self.candidates(key, forwarded)[0]
        logs.bind(node=first.name)
        try:
            return await first.grpc(key, path, request, metadata, deadline)
        except (errors.Unavailable, errors.Cancelled) as exc:
            second = self._retry_on(key, forwarded, first)
            if second is None:
                raise
            log.warning("%s unavailable for %s (%s); trying %s", first.name, key, exc.message, second.name)
        logs.bind(node=second.name)
        return await second.grpc(key, path, request, metadata, deadline)

    def _retry_on(self, key: RouteKey | None, forwarded: bool, tried):
        """The backend for the one retry: the best replica on the ring as it is now (it may have
        changed while the first try ran, e.g. the replica tried has left it), other than ``tried``."""
        if forwarded or key is None:
            return None
        return next((b for b in self.candidates(key) if b.name != tried.name), None)

    async def rest(self, key: RouteKey, method: str, path_qs: str, body: bytes, headers: dict[str, str],
                   timeout: float, forwarded: bool = False, status: bool = False) -> RestReply:
        """Forward a REST request; the serving node's reply, unchanged."""
        try:
            return await self._rest(key, method, path_qs, body, headers, timeout, forwarded)
        except errors.ModelNotFound as exc:
            if status:  # GET /v1/models/NAME[/versions/V]: GetModelStatus's texts
                raise status_not_found(key) from exc
            raise

    async def _rest(self, key, method, path_qs, body, headers, timeout, forwarded) -> RestReply:
        first = self.candidates(key, forwarded)[0]
        logs.bind(node=first.name)
        try:
            reply = await first.rest(key, method, path_qs, body, headers, timeout)
            if reply.status != 503:
                return reply
            second = self._retry_on(key, forwarded, first)
            if second is None:
                return reply
            reason = reply.body[:200]
        except errors.Unavailable as exc:
            second = self._retry_on(key, forwarded, first)
            if second is None:
                raise
            reason = exc.message
        log.warning("%s unavailable for %s (%s); trying %s", first.name, key, reason, second.name)
        logs.bind(node=second.name)
        return await second.rest(key, method, path_qs, body, headers, timeout)

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.close()
