"""The one method tfscache sidecars call on each other for host-tier sidecars (docs/tiers.md):
``/tfscache.v1.Tiers/Take``, on the gRPC port, beside the model server's own API.

A sidecar hands a version to a sidecar of the other tier with it: a GPU-tier sidecar demoting a
victim to a host-tier sidecar, a host-tier sidecar promoting a model back to its GPU-tier
sidecar. The receiver loads it on its own node through its cache (``CacheManager.take``: its
caps and policy apply, no request is counted, and no room now is RESOURCE_EXHAUSTED at once) and
answers once its node holds it. The request is JSON, ``{"name": ..., "version": N}``, the reply
``{"node": NAME}``; errors are gRPC statuses in tfscache's words. Only a call marked as a peer's
(``x-tfscache-forwarded``) is taken; any other is PERMISSION_DENIED.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import grpc

from tfscache import errors
from tfscache.frontend.backends import FORWARDED_KEY, PeerBackend

TAKE = "/tfscache.v1.Tiers/Take"

Take = Callable[[str, int, float | None], Awaitable[str]]  # (name, version, timeout) -> node name


def take_request(name: str, version: int) -> bytes:
    return json.dumps({"name": name, "version": version}).encode()


def taken_by(reply: bytes) -> str:
    """The node name a Take's reply names."""
    try:
        return str(json.loads(reply)["node"])
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.Internal(f"a peer's Take reply is not JSON with a node: {reply[:200]!r}") \
            from exc


async def take_on(peer: PeerBackend, name: str, version: int, timeout: float) -> str:
    """Hand ``(name, version)`` to ``peer``'s node: the name of its node once it holds it; the
    peer's error otherwise."""
    return taken_by(await peer.call(TAKE, take_request(name, version), timeout))


class TakeHandler(grpc.GenericRpcHandler):
    """Serves ``TAKE`` with ``take``, this sidecar's own node's."""

    def __init__(self, take: Take) -> None:
        self._take = take
        self._handler = grpc.unary_unary_rpc_method_handler(self._serve)

    def service(self, handler_call_details):
        return self._handler if handler_call_details.method == TAKE else None

    async def _serve(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            if not any(k == FORWARDED_KEY for k, _ in context.invocation_metadata() or ()):
                raise errors.PermissionDenied(f"{TAKE} is for tfscache sidecars' own calls")
            try:
                asked = json.loads(request)
                name, version = str(asked["name"]), int(asked["version"])
            except (ValueError, KeyError, TypeError):
                raise errors.InvalidArgument(
                    f"{TAKE} takes JSON {{\"name\": ..., \"version\": N}}") from None
            node = await self._take(name, version, context.time_remaining())
            return json.dumps({"node": node}).encode()
        except errors.TfscacheError as exc:
            await context.abort(exc.grpc_code, exc.message)
