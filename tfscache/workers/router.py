"""A worker's router: the Router's interface (tfscache.frontend.router), for the same GrpcFrontend
and RestFrontend, over delegations and the control process.

Warm: a request for a model version the worker holds a delegation for (tfscache.workers.delegation)
goes straight to that node, under the worker's own in-flight count; no round trip to the control
process. Everything else (no delegation, a probe, a stream, a request a peer sidecar forwarded,
statistics) goes, bytes unchanged, to the control process's internal listeners, which run today's
whole path (load, route, lease, retries); after such a request the worker asks for a delegation.
A delegated send that the node answers UNAVAILABLE or NOT_FOUND (the node went away, restarted, or
lost the model) drops the delegation and goes through the control process, which rechecks and
retries as a single process does.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

from tfscache import errors
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY, remaining
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.upstream import RestReply, Upstream
from tfscache.workers.delegation import Asked, Delegations, Grant

# The control process's own load report on its answer to the request this task serves (sidecar mode,
# a request a peer forwarded): what the worker's front end sends back to that peer.
_load: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tfscache_worker_load", default=None
)


def _keep_load(pairs) -> None:
    for key, value in pairs or ():
        if key == LOAD_KEY:
            _load.set(value)


class ControlBackend:
    """The control process's internal listeners, as the one backend a worker's streams go to."""

    name = "control"
    healthy = True

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    def holds(self, key: RouteKey) -> bool:
        return False

    async def stream(self, key, path: str, request: bytes, metadata, deadline):
        async for response in self.upstream.stream(
            path, request, metadata=metadata, timeout=remaining(deadline)
        ):
            yield response

    async def rest_stream(
        self, key, method: str, path_qs: str, body: bytes, headers: dict[str, str], timeout: float
    ):
        async for part in self.upstream.rest_stream(
            method, path_qs, body, headers, timeout=timeout
        ):
            yield part

    async def wait_serving(self, timeout: float) -> bool:
        return await self.upstream.wait_ready(timeout)

    async def close(self) -> None:
        await self.upstream.close()


class WorkerRouter:
    """What a worker's front ends route through (the Router's interface)."""

    local = None  # no node of its own: statistics and the like go to the control process
    backends: Mapping = MappingProxyType({})
    spread = None

    def __init__(
        self,
        control: Upstream,
        delegations: Delegations,
        *,
        want: Callable[[Asked], None],
        node_upstream: Callable[[Grant], Upstream],
        repository=None,
        served: Callable[[Grant], None] | None = None,
    ) -> None:
        """``want(asked)``: ask the control process for a delegation. ``node_upstream(grant)``: the
        connection to a granted node. ``repository``: version labels (a local ModelRepository).
        ``served(grant)``: a request was answered by the node under ``grant`` (in the request's task:
        the worker counts the cache hit and logs it)."""
        self._control = control
        self._backend = ControlBackend(control)
        self._delegations = delegations
        self._want = want
        self._node = node_upstream
        self.repository = repository
        self._served = served or (lambda grant: None)

    @property
    def resolves_labels(self) -> bool:
        """Labels are resolved here from a local repository's labels.json; otherwise (a bucket) a label
        request goes on with its label to the control process, which resolves it."""
        return self.repository is not None

    async def read_labels(self, name: str) -> None:
        if self.repository is not None:
            await self.repository.refresh_labels(name)

    def label_version(self, name: str, label: str) -> int:
        return self.repository.label_version(name, label, max_age=self.repository.rescan_s + 1.0)

    def own_load(self) -> str | None:
        """The load the control process reported on its answer to this request (a request a peer
        sidecar forwarded: ``LOAD_KEY``), for the front end to send back to that peer."""
        return _load.get()

    def _asked(self, key: RouteKey | None, forwarded: bool, probe) -> Asked | None:
        if key is None or forwarded or probe is not None or key.label is not None:
            return None
        return key.name, key.version

    def _cold(self, asked: Asked | None) -> None:
        if asked is not None and self._delegations.want(asked):
            self._want(asked)

    async def grpc(
        self,
        path: str,
        key: RouteKey | None,
        request: bytes,
        metadata,
        deadline: float | None,
        forwarded: bool = False,
        probe=None,
    ) -> bytes:
        asked = self._asked(key, forwarded, probe)
        grant = self._delegations.begin(asked) if asked is not None else None
        if grant is not None:
            try:
                response = await self._node(grant).unary(
                    path, request, metadata=metadata, timeout=remaining(deadline)
                )
                self._served(grant)
                return response
            except (errors.Unavailable, errors.NotFound):
                # the node went away or lost it: the control process's path
                self._delegations.drop(grant)
            finally:
                self._delegations.end(grant)
        if forwarded:
            # an aiohttp connection's requests share a task: no report left from the last one
            _load.set(None)
        response = await self._control.unary(
            path,
            request,
            metadata=metadata,
            timeout=remaining(deadline),
            trailers=_keep_load if forwarded else None,
        )
        self._cold(asked)
        return response

    async def rest(
        self,
        key: RouteKey | None,
        method: str,
        path_qs: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        forwarded: bool = False,
        probe=None,
    ) -> RestReply:
        deadline = time.monotonic() + timeout
        asked = self._asked(key, forwarded, probe)
        grant = self._delegations.begin(asked) if asked is not None else None
        if grant is not None and grant.rest is not None:
            try:
                reply = await self._node(grant).rest(
                    method, path_qs, body, headers, timeout=timeout
                )
                if reply.status not in (404, 503):
                    self._served(grant)
                    return reply
                self._delegations.drop(grant)  # not served there now: the control process's path
            except errors.Unavailable:
                self._delegations.drop(grant)
            finally:
                self._delegations.end(grant)
        elif grant is not None:
            self._delegations.end(grant)
        if forwarded:
            headers = {**headers, FORWARDED_KEY: "1"}
        reply = await self._control.rest(
            method, path_qs, body, headers, timeout=remaining(deadline) or 0.001
        )
        if forwarded:
            _load.set(None)
            _keep_load(reply.headers)
        if reply.status < 400:
            self._cold(asked)
        return reply

    async def open(self, key: RouteKey | None, forwarded: bool, deadline: float | None,
                   send: Callable[[object], Awaitable]):
        return await send(self._backend)

    async def close(self) -> None:
        await self._control.close()
