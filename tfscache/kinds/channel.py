"""One gRPC channel to a node, with what every kind's client shares: deadlines, errors, reconnects.

Front-end upstreams (tfscache.frontend.upstream) use the same reconnect options and
readiness wait, so a node or peer that restarts is reached again within a second.
"""

from __future__ import annotations

import asyncio

import grpc

from tfscache import errors

MAX_MESSAGE_BYTES = 2**31 - 1  # TF Serving's own limit, both ways

# A node or peer that restarts is back within seconds: reconnect within a second of it
# listening again, not after gRPC's default backoff (up to 120 s).
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


async def channel_ready(channel: grpc.aio.Channel, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``channel`` to connect, reconnecting now; whether it did."""
    try:
        async with asyncio.timeout(timeout):
            await channel.channel_ready()
        return True
    except TimeoutError:
        return False


class NodeChannel:
    """One gRPC channel to a node, with the calls every node client shares: a deadline on each
    RPC, errors translated once (UNAVAILABLE as ``NodeUnavailable`` naming the node, the rest
    by code with the node's own message), and waiting for the channel to connect."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        self.target = target
        self.rpc_deadline_s = rpc_deadline_s
        self._channel = channel or grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            *RECONNECT_OPTIONS,
        ])

    def method(self, path: str, request, response) -> grpc.aio.UnaryUnaryMultiCallable:
        """A unary method at ``path`` with these message classes."""
        return self._channel.unary_unary(path, request_serializer=request.SerializeToString,
                                         response_deserializer=response.FromString)

    async def rpc(self, method, request, deadline_s: float | None):
        """Call ``method`` with the deadline (default ``rpc_deadline_s``); failures as TfscacheErrors."""
        timeout = self.rpc_deadline_s if deadline_s is None else deadline_s
        try:
            return await method(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise errors.NodeUnavailable(
                    f"node {self.target} is unavailable: {e.details()}"
                ) from e
            raise errors.error_for_code(e.code(), e.details() or "") from e

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the channel to connect to the node; whether it did.

        Not an RPC: it waits for a TCP and HTTP/2 connection (the node listening again
        after a restart), and asks the channel to reconnect now rather than after its backoff.
        """
        return await channel_ready(self._channel, timeout)

    async def close(self) -> None:
        await self._channel.close()
