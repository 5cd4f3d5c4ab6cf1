"""What the router forwards to: a node with its one CacheManager, or a peer sidecar.

A ``NodeBackend`` holds a lease from the node's cache for the length of each call, so
the model stays loaded while the request runs. A ``PeerBackend`` is another tfscache
sidecar that owns the model: requests go to its front end marked as forwarded, and it
serves them from its own node without routing again (at most one extra hop).
"""

from __future__ import annotations

import contextlib
import time

from tfscache import errors
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.upstream import RestReply, Upstream

FORWARDED_KEY = "x-tfscache-forwarded"  # gRPC metadata key / HTTP header on a forwarded request


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a monotonic deadline (None = no deadline); DEADLINE_EXCEEDED when gone."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise errors.DeadlineExceeded("Deadline Exceeded")
    return left


class NodeBackend:
    """A TF Serving node and the CacheManager that alone writes its config."""

    kind = "node"

    def __init__(self, name: str, upstream: Upstream | None = None, cache=None, *,
                 load_timeout_s: float = 600.0) -> None:
        self.name = name
        self.upstream = upstream
        self.cache = cache
        self.load_timeout_s = load_timeout_s

    def __repr__(self) -> str:
        return f"NodeBackend({self.name}, {self.upstream})"

    def attach(self, upstream: Upstream, cache, *, load_timeout_s: float | None = None) -> None:
        """Point at a (re)started node process and its cache."""
        self.upstream, self.cache = upstream, cache
        if load_timeout_s is not None:
            self.load_timeout_s = load_timeout_s

    def detach(self) -> None:
        self.upstream = self.cache = None

    @property
    def healthy(self) -> bool:
        return self.upstream is not None and self.cache is not None and bool(self.cache.healthy)

    def holds(self, key: RouteKey) -> bool:
        """Whether the model is already resident here (tried first among replicas)."""
        cache = self.cache
        return cache is not None and bool(cache.is_resident(key.name, key.version))

    @contextlib.asynccontextmanager
    async def _leased(self, key: RouteKey | None, deadline: float | None):
        cache, upstream = self.cache, self.upstream
        if cache is None or upstream is None:
            raise errors.NodeUnavailable(f"node {self.name} is not running")
        if key is None:  # no model named: the node answers with TF Serving's own error
            yield upstream
            return
        left = remaining(deadline)
        lease = await cache.acquire(key.name, key.version, timeout=self.load_timeout_s if left is None else left)
        async with lease:
            yield upstream

    async def grpc(self, key: RouteKey | None, path: str, request: bytes, metadata, deadline) -> bytes:
        async with self._leased(key, deadline) as upstream:
            return await upstream.unary(path, request, metadata=metadata, timeout=remaining(deadline))

    async def rest(self, key: RouteKey | None, method: str, path_qs: str, body: bytes,
                   headers: dict[str, str], timeout: float) -> RestReply:
        deadline = time.monotonic() + timeout
        async with self._leased(key, deadline) as upstream:
            return await upstream.rest(method, path_qs, body, headers, timeout=remaining(deadline))

    async def close(self) -> None:
        if self.upstream is not None:
            await self.upstream.close()


class PeerBackend:
    """Another sidecar's front end; it owns some models and serves them from its node."""

    kind = "peer"

    def __init__(self, name: str, upstream: Upstream, self_name: str) -> None:
        self.name = name
        self.upstream = upstream
        self._marker = (FORWARDED_KEY, self_name)

    def __repr__(self) -> str:
        return f"PeerBackend({self.name}, {self.upstream})"

    healthy = True

    def holds(self, key: RouteKey) -> bool:
        return False

    async def grpc(self, key, path: str, request: bytes, metadata, deadline) -> bytes:
        return await self.upstream.unary(path, request, metadata=(*metadata, self._marker),
                                         timeout=remaining(deadline))

    async def rest(self, key, method: str, path_qs: str, body: bytes, headers: dict[str, str],
                   timeout: float) -> RestReply:
        return await self.upstream.rest(method, path_qs, body, {**headers, FORWARDED_KEY: self._marker[1]},
                                        timeout=timeout)

    async def retire(self, grace: float) -> None:
        """Off the ring: close the channel once the requests already sent here have finished."""
        await self.upstream.retire(grace)

    async def close(self) -> None:
        await self.upstream.close()
