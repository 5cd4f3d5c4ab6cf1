"""Routing: which backend serves a request, and retries while nodes restart.

The ring maps a model name to ``replicas_per_model`` distinct backends. Among them
a healthy one that already holds the model goes first, then the others in ring
order. If the chosen one answers UNAVAILABLE (node down, connection lost, its channel
closed because it left the ring) or CANCELLED (a peer that cancelled the call while
shutting down or draining; our own caller cancelling cancels this task instead), the
best other replica on the ring as it is then is tried at once. When every replica
failed, the request waits for one to serve again (a node restarting, a sidecar's node
coming up) and is tried again, for as long as its deadline allows (no deadline:
``wait_s``, the cache's ``load_timeout_s``). The last error is returned when no replica
will come back (their caches drain), or when replicas that said they could serve
failed again ``_READY_RETRIES`` times (a node that itself answers UNAVAILABLE), with
a backoff between those rounds. A request forwarded by a peer sidecar is served locally and
never routed again, so a request makes at most one extra hop and cannot loop.

A version label is resolved to its version (``label_version``) before routing, as
TF Serving resolves it to ``Specific(NAME, V)``; the transports rewrite the request.
The backend a request goes to is bound to the log context (``node``); each send to a peer
sidecar and each failed try are counted (``Metrics.forwarded``, ``retried``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from tfscache import errors, logs
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.probe import ProbeAnswer
from tfscache.frontend.upstream import RestReply
from tfscache.cluster.ring import Ring

log = logging.getLogger("tfscache.frontend.router")

# wait this long for a replica, then look at the ring again (it may have changed)
_WAIT_SLICE_S = 2.0
_MAX_BACKOFF_S = 1.0
# rounds in which a replica said it could serve and then failed again; then give up
_READY_RETRIES = 3


class _Unavailable503(errors.NodeUnavailable):
    """A REST reply of 503 from a backend: retried like UNAVAILABLE; returned as it came if it stays."""

    def __init__(self, reply: RestReply) -> None:
        super().__init__(reply.body[:200].decode("utf-8", "replace"))
        self.reply = reply


class Router:
    """Picks backends for a RouteKey over the ring and forwards to them."""

    def __init__(self, ring: Ring, backends: dict, local: str | None = None, repository=None,
                 wait_s: float = 600.0, metrics=None, spread=None) -> None:
        # tfscache.cluster.spread.Spread: copies that follow load (None: fixed replicas)
        self.spread = spread
        # tfscache.observe.metrics.Metrics: forwards to peers and retries counted per backend
        self.metrics = metrics
        self.ring = ring
        self.backends = backends  # ring node name -> Backend (tfscache.frontend.backends)
        self.local = local  # sidecar mode: the name of this sidecar's own node
        self.repository = repository  # tfscache.repository.local.ModelRepository: version labels
        self.wait_s = wait_s  # how long a request without a deadline waits for a node to come back
        # the host-tier nodes, off the ring (docs/tiers.md): () -> backends
        self.host_tier: Callable[[], list] = list

    # The front ends resolve a version label here before routing (False: a router that passes the
    # request on with its label, for whoever it reaches to resolve: a worker without the repository).
    resolves_labels = True

    def update(self, ring: Ring, backends: Mapping) -> None:
        """Route over ``ring`` and ``backends`` from now on (tfscache.cluster.topology.Topology calls this).

        Both change together: a request that looks up a ring node finds its backend.
        """
        self.ring, self.backends = ring, backends

    async def read_labels(self, name: str) -> None:
        """Have ``name``'s labels.json read (in a worker thread) before ``label_version`` is asked."""
        if self.repository is not None:
            await self.repository.refresh_labels(name)

    def label_version(self, name: str, label: str) -> int:
        """The version a label names (the repository's labels.json, as ``read_labels`` read it just
        before, or read now for a name it was not asked for); TF Serving's errors."""
        if self.repository is None:
            raise errors.InvalidArgument(f"Unrecognized servable version label: {label}")
        # What read_labels read just now counts, whatever rescan_s is (tests use 0).
        return self.repository.label_version(name, label, max_age=self.repository.rescan_s + 1.0)

    def own_load(self) -> str | None:
        """Sidecar mode with copies: this sidecar's own node's load (its copies signal), as sent back
        on the answer to a forwarded request (``LOAD_KEY``); None otherwise."""
        if self.spread is None or self.local is None:
            return None
        return f"{self.spread.copies.load(self.local):.6g}"

    def candidates(self, key: RouteKey | None, forwarded: bool = False) -> list:
        """Backends to try, best first (at most two are ever tried)."""
        if forwarded or (key is None and self.local):
            if self.local is None:
                raise errors.FailedPrecondition(
                    "request forwarded to a tfscache that has no node of its own"
                )
            own = [self.backends[self.local]]
            # a model this sidecar demoted to a host-tier sidecar goes on there (a second hop,
            # the last: a host-tier sidecar hands nothing on)
            return own if key is None else self._host_first(key, own)
        if key is None:  # no model named: any healthy node reports TF Serving's error
            nodes = [b for b in self.backends.values() if b.healthy] or list(self.backends.values())
            return nodes[:1]
        if self.spread is not None:
            return self._host_first(key, self.spread.candidates(key, self.ring, self.backends,
                                                                self.local))
        replicas = [self.backends[name] for name in self.ring.replicas_for(key.name)]
        if len(replicas) < 2:  # one replica: nothing to order
            if not replicas:
                raise errors.NodeUnavailable("no nodes in the ring")
            return self._host_first(key, replicas)
        # Stable sort keeps ring order within each class.
        return self._host_first(key, sorted(
            replicas, key=lambda b: (not b.healthy, b.name != self.local and not b.holds(key))
        ))

    def _host_first(self, key: RouteKey, replicas: list) -> list:
        """``replicas`` led by a healthy host-tier node that holds the model, when no replica
        leading them does (a demoted model: answered from host memory at once; docs/tiers.md)."""
        tier = self.host_tier()
        if not tier or (replicas[0].healthy and replicas[0].holds(key)):
            return replicas
        holder = next((b for b in tier if b.healthy and b.holds(key)), None)
        return replicas if holder is None else [holder, *replicas]

    async def grpc(
        self,
        path: str,
        key: RouteKey | None,
        request: bytes,
        metadata,
        deadline: float | None,
        forwarded: bool = False,
        probe: Callable[[ProbeAnswer], bytes] | None = None,
    ) -> bytes:
        """Forward a gRPC request's bytes; the response bytes of the serving node. ``probe``: the
        request is a status probe, answered so for a version not on its node (no load)."""
        return await self._call(
            key,
            forwarded,
            deadline,
            lambda backend: backend.grpc(key, path, request, metadata, deadline, probe=probe),
        )

    async def open(self, key: RouteKey | None, forwarded: bool, deadline: float | None,
                   send: Callable[[object], Awaitable]):
        """``send(backend)`` to the backend chosen as for any request, with the same retries
        (``tfscache.frontend.streams`` opens a stream with it)."""
        return await self._call(key, forwarded, deadline, send)

    async def _call(self, key: RouteKey | None, forwarded: bool, deadline: float | None,
                    send: Callable[[object], Awaitable]):
        """``send(backend)`` to the best replica; on UNAVAILABLE the next, then wait for one to return.

        Candidates are taken from the ring as it is at each try: a replica may leave it
        (drained, gone from discovery) while a request waits.
        """
        tried: set[str] = set()
        rounds = 0
        limit = time.monotonic() + (
            self.wait_s if deadline is None else max(0.0, deadline - time.monotonic())
        )
        while True:
            candidates = self.candidates(key, forwarded)
            backend = next((b for b in candidates if b.name not in tried), None)
            if backend is None:
                if key is None or rounds >= _READY_RETRIES:
                    raise last
                ready = await self._wait_for(candidates, limit, rounds)
                if ready is None:
                    raise last
                tried.clear()
                rounds += ready
                continue
            logs.bind(node=backend.name)
            if self.metrics is not None and self.local is not None and backend.name != self.local:
                # sidecar mode: any backend but its own node is a peer
                self.metrics.forwarded(backend.name)
            try:
                if self.spread is None or key is None:
                    return await send(backend)
                with self.spread.serving(key.name, backend.name):
                    return await send(backend)
            except (errors.Unavailable, errors.Cancelled) as exc:
                last = exc
                tried.add(backend.name)
                if self.metrics is not None:
                    self.metrics.retried(backend.name)
                log.info("%s unavailable for %s: %s", backend.name, key, exc.message[:200])

    async def _wait_for(self, candidates: list, limit: float, rounds: int) -> bool | None:
        """Wait until one of ``candidates`` may serve again: True; False when none did within a
        slice but time is left (the ring may have changed); None when none will before ``limit``."""
        left = limit - time.monotonic()
        if left <= 0:
            return None
        if rounds:  # it said it could serve and failed again: back off
            await asyncio.sleep(min(left, _MAX_BACKOFF_S, 0.1 * 2 ** (rounds - 1)))
        waits = [
            asyncio.ensure_future(
                b.wait_serving(min(max(0.0, limit - time.monotonic()), _WAIT_SLICE_S))
            )
            for b in candidates
        ]
        try:
            for done in asyncio.as_completed(waits):
                with contextlib.suppress(errors.Unavailable):  # that one will not come back
                    if await done:
                        return True
        finally:
            for w in waits:
                w.cancel()
        # Nobody ready within the slice: look at the ring again while time is left, unless every
        # candidate said it will not come back (a draining cache says so at once).
        if time.monotonic() >= limit or all(_gave_up(w) for w in waits):
            return None
        return False

    async def rest(
        self,
        key: RouteKey,
        method: str,
        path_qs: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        forwarded: bool = False,
        probe: Callable[[ProbeAnswer], RestReply] | None = None,
    ) -> RestReply:
        """Forward a REST request; the serving node's reply, unchanged. ``probe``: as for ``grpc``."""
        deadline = time.monotonic() + timeout

        async def send(backend) -> RestReply:
            reply = await backend.rest(
                key,
                method,
                path_qs,
                body,
                headers,
                max(0.001, deadline - time.monotonic()),
                probe=probe,
            )
            if reply.status == 503:
                raise _Unavailable503(reply)
            return reply

        try:
            return await self._call(key, forwarded, deadline, send)
        except _Unavailable503 as exc:
            return exc.reply

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.close()


def _gave_up(wait: asyncio.Future) -> bool:
    """A ``wait_serving`` that said its backend will not serve again."""
    return wait.done() and not wait.cancelled() and isinstance(wait.exception(), errors.Unavailable)
