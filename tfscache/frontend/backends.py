"""What the router forwards to: a node with its one CacheManager, or a peer sidecar.

A ``NodeBackend`` holds a lease from the node's cache for the length of each call, so
the model stays loaded while the request runs. A ``PeerBackend`` is another tfscache
sidecar that owns the model: requests go to its front end marked as forwarded, and it
serves them from its own node without routing again (at most one extra hop).

A node that answers NOT_FOUND for the model a lease is held on, in its kind's words (the
adapter's ``lost_texts``), has lost it (it restarted behind a sidecar, at the same address): the
cache rechecks and restores what it
lost, and the request is sent once more.
A node that runs out of memory running a request (its kind's out-of-memory text, in a gRPC error
or a REST error body) gets room made on it (idle models unloaded) and the request once more;
the client sees the answer, or RESOURCE_EXHAUSTED naming the caps and what holds the node.
A status probe (``Method.probe``) takes no lease and loads nothing (``tfscache.frontend.probe``).
Streams (``stream``, ``rest_stream``: 0..N messages for one request) hold the lease
until the node's last message, an error, or the caller closing the stream (its client
went away); the lost-model recheck is not made for them.
Both kinds say when they can serve again (``wait_serving``), for the router to wait
on a node that restarts.

``Backend`` is what the router and the topology need of either; code that must tell
them apart asks ``isinstance(b, NodeBackend)`` (a local node with a cache), never a
``kind`` string.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

from tfscache import errors
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.probe import ProbeAnswer
from tfscache.frontend.upstream import RestReply, Upstream

FORWARDED_KEY = "x-tfscache-forwarded"  # gRPC metadata key / HTTP header on a forwarded request
# Trailing metadata key / HTTP header on the answer to a forwarded request: the serving sidecar's
# own node's load, in its copies signal (docs/copies.md, "Sidecars").
LOAD_KEY = "x-tfscache-load"
# gRPC metadata key / HTTP header HAProxy's data plane sets on what it routes to a peer sidecar
# (tfscache.dataplane.config), with the forwarded mark: no one there reads a load report, so the
# peer sends none (on gRPC it would reach the client, in trailers HAProxy cannot edit). Never sent
# on to a node or a peer (upstream.py): it speaks of one hop.
VIA_KEY = "x-tfscache-via"
VIA_DATA_PLANE = "haproxy"
_OOM_TEXT_BYTES = 4096  # of a REST error's body, read for a node's out-of-memory text


def parse_load(value: str | None) -> float | None:
    """A reported load, or None when absent or not a finite number >= 0 (a bad report is ignored)."""
    if value is None:
        return None
    try:
        load = float(value)
    except ValueError:
        return None
    return load if 0.0 <= load < float("inf") else None


class _LostReply(errors.NotFound):
    """A REST 404 with a "not found" body for a leased model, raised to be rechecked like gRPC's."""

    def __init__(self, reply: RestReply, text: str) -> None:
        # the kind's words the body holds: ``_forward`` matches them to recheck
        super().__init__(text)
        self.reply = reply


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a monotonic deadline (None = no deadline); DEADLINE_EXCEEDED when gone."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise errors.DeadlineExceeded("Deadline Exceeded")
    return left


@runtime_checkable
class Backend(Protocol):
    """What the router forwards to, and the topology puts on the ring by ``name``."""

    name: str
    upstream: Upstream | None  # its connection (None while a node is down)

    @property
    def healthy(self) -> bool:
        """Whether it can take requests now (routing prefers healthy replicas)."""

    def holds(self, key: RouteKey) -> bool:
        """Whether the model is resident here already (tried first among replicas)."""

    async def grpc(self, key: RouteKey | None, path: str, request: bytes, metadata, deadline, *,
                   probe: Callable[[ProbeAnswer], bytes] | None = None) -> bytes:
        """Forward a gRPC request's bytes; the response's bytes."""

    async def rest(self, key: RouteKey | None, method: str, path_qs: str, body: bytes,
                   headers: dict[str, str], timeout: float, *,
                   probe: Callable[[ProbeAnswer], RestReply] | None = None) -> RestReply:
        """Forward a REST request; the reply as it came."""

    def stream(
        self, key: RouteKey | None, path: str, request: bytes, metadata, deadline
    ) -> AsyncIterator[bytes]:
        """Forward one request to a streaming gRPC method; its responses' bytes as they come."""

    def rest_stream(self, key: RouteKey | None, method: str, path_qs: str, body: bytes,
                    headers: dict[str, str], timeout: float) -> AsyncIterator[RestReply | bytes]:
        """Forward a REST request whose reply streams: its head, then its body's chunks as they come."""

    async def wait_serving(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until it can serve again; ``NodeUnavailable`` when it never will."""

    async def close(self) -> None:
        """Close its connections."""


class NodeBackend:
    """A model-server node and the CacheManager that alone decides what it serves."""

    def __init__(self, name: str, upstream: Upstream | None = None, cache=None, *,
                 load_timeout_s: float = 600.0) -> None:
        self.name = name
        self.upstream = upstream
        self.cache = cache
        self.load_timeout_s = load_timeout_s
        self._attached = asyncio.Event()  # set while a node process and its cache are attached
        if upstream is not None and cache is not None:
            self._attached.set()

    def __repr__(self) -> str:
        return f"NodeBackend({self.name}, {self.upstream})"

    def attach(self, upstream: Upstream, cache, *, load_timeout_s: float | None = None) -> None:
        """Point at a (re)started node process and its cache."""
        self.upstream, self.cache = upstream, cache
        if load_timeout_s is not None:
            self.load_timeout_s = load_timeout_s
        self._attached.set()

    def detach(self) -> None:
        self.upstream = self.cache = None
        self._attached.clear()

    async def wait_serving(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until the node can serve: (re)started, its cache healthy, connected.

        False if it did not in time; ``NodeUnavailable`` at once when it will not (its cache
        drains, or stopped with no node process replacing it: this process is stopping).
        """
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self._attached.wait()
                    cache, upstream = self.cache, self.upstream
                    if cache.draining:
                        raise errors.NodeUnavailable(f"node {self.name} is draining")
                    if await cache.wait_ready(None):
                        connected = await upstream.wait_ready(timeout)
                        if self.upstream is upstream:
                            return connected
                        # its process was replaced meanwhile (the old channel closed): the new one
                        continue
                    if self.cache is cache:
                        raise errors.NodeUnavailable(f"node {self.name} stopped")
                    # its process exited and the cache with it: wait for the restarted one
        except TimeoutError:
            return False

    @property
    def healthy(self) -> bool:
        return self.upstream is not None and self.cache is not None and bool(self.cache.healthy)

    def holds(self, key: RouteKey) -> bool:
        """Whether the model is already resident here (tried first among replicas)."""
        cache = self.cache
        return cache is not None and bool(cache.is_resident(key.name, key.version))

    async def _lease(self, key: RouteKey | None, deadline: float | None):
        """The node's upstream and a lease on ``key`` (None when no model is named: the node answers
        with TF Serving's own error). No generator-based context manager: every warm request comes here.
        """
        cache, upstream = self.cache, self.upstream
        if cache is None or upstream is None:
            raise errors.NodeUnavailable(f"node {self.name} is not running")
        if key is None:
            return upstream, None
        left = remaining(deadline)
        return upstream, await cache.acquire(key.name, key.version,
                                             timeout=self.load_timeout_s if left is None else left)

    @contextlib.asynccontextmanager
    async def _leased(self, key: RouteKey | None, deadline: float | None):
        """``_lease`` for a stream: the model stays leased until the stream ends (once per stream)."""
        upstream, lease = await self._lease(key, deadline)
        if lease is None:
            yield upstream
            return
        async with lease:
            yield upstream

    async def _forward(self, key: RouteKey | None, deadline: float | None,
                       send: Callable[[Upstream], Awaitable]):
        """``send(upstream)`` under a lease; if the node lost the leased model, recheck and send again."""
        upstream, lease = await self._lease(key, deadline)
        if lease is None:
            return await send(upstream)
        async with lease:
            try:
                return await self._answer(lease, upstream, send)
            except errors.NotFound as exc:
                if not exc.message.startswith(self.cache.lost_texts):
                    raise
        cache = self.cache
        if cache is None:
            raise errors.NodeUnavailable(f"node {self.name} is not running")
        left = remaining(deadline)
        try:
            async with asyncio.timeout(self.load_timeout_s if left is None else left):
                await cache.recheck()
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"Timed out waiting for node {self.name} to restore its models"
            ) from None
        upstream, lease = await self._lease(key, deadline)
        async with lease:
            return await self._answer(lease, upstream, send)

    async def _answer(self, lease, upstream: Upstream, send: Callable[[Upstream], Awaitable]):
        """``send(upstream)``; if the node ran out of memory running it, make room
        (``CacheManager.out_of_memory``) and send once more: the answer, or RESOURCE_EXHAUSTED
        naming the caps and what holds the node, never the node's own out-of-memory text."""
        try:
            return await send(upstream)
        except errors.TfscacheError as exc:
            if isinstance(exc, errors.NotFound) or not errors.is_out_of_memory(exc.message):
                raise
        cache = self.cache
        unloaded = await cache.out_of_memory(lease.name, lease.version)
        try:
            return await send(upstream)
        except errors.TfscacheError as exc:
            if isinstance(exc, errors.NotFound) or not errors.is_out_of_memory(exc.message):
                raise
        raise errors.ResourceExhausted(cache.oom_message(lease.name, lease.version, unloaded))

    async def _probe(self, key: RouteKey) -> ProbeAnswer | None:
        """A status request for a version not on the node, answered without loading it; else None."""
        cache = self.cache
        if cache is None:
            raise errors.NodeUnavailable(f"node {self.name} is not running")
        version = await cache.version_on_disk(key.name, key.version)  # lists the directory
        if cache.state_of(key.name, version) in ("loading", "available"):
            return None  # the node's own answer
        return ProbeAnswer(version, cache.failure(key.name, version))

    async def grpc(self, key: RouteKey | None, path: str, request: bytes, metadata, deadline, *,
                   probe: Callable[[ProbeAnswer], bytes] | None = None) -> bytes:
        if key is not None and probe is not None:
            answer = await self._probe(key)
            if answer is not None:
                return probe(answer)
            return await self.upstream.unary(
                path, request, metadata=metadata, timeout=remaining(deadline)
            )
        return await self._forward(key, deadline, lambda upstream: upstream.unary(
            path, request, metadata=metadata, timeout=remaining(deadline)))

    async def rest(self, key: RouteKey | None, method: str, path_qs: str, body: bytes,
                   headers: dict[str, str], timeout: float, *,
                   probe: Callable[[ProbeAnswer], RestReply] | None = None) -> RestReply:
        deadline = time.monotonic() + timeout
        if key is not None and probe is not None:
            answer = await self._probe(key)
            if answer is not None:
                return probe(answer)
            return await self.upstream.rest(method, path_qs, body, headers, timeout=timeout)

        async def send(upstream: Upstream) -> RestReply:
            reply = await upstream.rest(method, path_qs, body, headers, timeout=remaining(deadline))
            if reply.status >= 500 or reply.status in (400, 429):
                text = reply.body[:_OOM_TEXT_BYTES].decode("utf-8", "replace")
                if errors.is_out_of_memory(text):
                    raise errors.ResourceExhausted(text)  # _answer makes room and sends again
            if reply.status == 404:
                head = reply.body[:200]
                lost = next((t for t in self.cache.lost_texts if t.encode() in head), None)
                if lost is not None:
                    raise _LostReply(reply, lost)
            return reply

        try:
            return await self._forward(key, deadline, send)
        except _LostReply as lost:  # the node still has not got it: its answer, as it came
            return lost.reply

    async def stream(self, key: RouteKey | None, path: str, request: bytes, metadata,
                     deadline) -> AsyncIterator[bytes]:
        """The node's responses to one streamed request, the model leased until the last one."""
        async with (
            self._leased(key, deadline) as upstream,
            contextlib.aclosing(
                upstream.stream(path, request, metadata=metadata, timeout=remaining(deadline))
            ) as responses,
        ):
            async for response in responses:
                yield response

    async def rest_stream(
        self,
        key: RouteKey | None,
        method: str,
        path_qs: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
    ) -> AsyncIterator[RestReply | bytes]:
        """The node's streamed REST reply (head, then chunks), the model leased until its end."""
        async with self._leased(key, time.monotonic() + timeout) as upstream, contextlib.aclosing(
                upstream.rest_stream(method, path_qs, body, headers, timeout=timeout)) as parts:
            async for part in parts:
                yield part

    async def close(self) -> None:
        if self.upstream is not None:
            await self.upstream.close()


class PeerBackend:
    """Another sidecar's front end; it owns some models and serves them from its node."""

    def __init__(self, name: str, upstream: Upstream, self_name: str,
                 on_load: Callable[[str, float], None] | None = None) -> None:
        """``on_load(name, load)``: called with the load the peer reports of its own node on the
        answer to a forwarded request (``LOAD_KEY``); None: reports are not read."""
        self.name = name
        self.upstream = upstream
        self._marker = (FORWARDED_KEY, self_name)
        self._on_load = on_load
        # a host-tier peer: the models this sidecar handed it (docs/tiers.md), until taken back
        self.holding: set[str] = set()

    def __repr__(self) -> str:
        return f"PeerBackend({self.name}, {self.upstream})"

    healthy = True

    def holds(self, key: RouteKey) -> bool:
        return key.name in self.holding

    async def call(self, path: str, request: bytes, timeout: float | None) -> bytes:
        """One of tfscache's own methods on the peer, marked as a peer's call (tfscache.frontend.tiers)."""
        return await self.upstream.unary(path, request, metadata=(self._marker,), timeout=timeout)

    async def wait_serving(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the peer to accept connections again."""
        return await self.upstream.wait_ready(timeout)

    async def grpc(
        self, key, path: str, request: bytes, metadata, deadline, *, probe=None
    ) -> bytes:
        """``probe`` is the peer's to answer: it owns the model's node."""
        return await self.upstream.unary(path, request, metadata=(*metadata, self._marker),
                                         timeout=remaining(deadline),
                                         trailers=None if self._on_load is None else self._trailers)

    def _trailers(self, metadata) -> None:
        for k, v in metadata or ():
            if k == LOAD_KEY:
                self._report(v)

    def _report(self, value: str | None) -> None:
        load = parse_load(value)
        if load is not None:
            self._on_load(self.name, load)

    async def rest(self, key, method: str, path_qs: str, body: bytes, headers: dict[str, str],
                   timeout: float, *, probe=None) -> RestReply:
        reply = await self.upstream.rest(
            method, path_qs, body, {**headers, FORWARDED_KEY: self._marker[1]}, timeout=timeout
        )
        if not reply.headers:
            return reply
        kept = tuple((h, v) for h, v in reply.headers if h != LOAD_KEY)
        if len(kept) == len(reply.headers):
            return reply
        if self._on_load is not None:
            self._report(dict(reply.headers)[LOAD_KEY])
        # the report is for this sidecar, not its client
        return dataclasses.replace(reply, headers=kept)

    async def stream(
        self, key, path: str, request: bytes, metadata, deadline
    ) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(
            self.upstream.stream(
                path, request, metadata=(*metadata, self._marker), timeout=remaining(deadline)
            )
        ) as responses:
            async for response in responses:
                yield response

    async def rest_stream(
        self, key, method: str, path_qs: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> AsyncIterator[RestReply | bytes]:
        async with contextlib.aclosing(
            self.upstream.rest_stream(
                method, path_qs, body, {**headers, FORWARDED_KEY: self._marker[1]}, timeout=timeout
            )
        ) as parts:
            async for part in parts:
                yield part

    async def retire(self, grace: float) -> None:
        """Off the ring: close the channel once the requests already sent here have finished."""
        await self.upstream.retire(grace)

    async def close(self) -> None:
        await self.upstream.close()
