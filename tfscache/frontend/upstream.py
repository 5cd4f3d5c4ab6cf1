"""Raw byte forwarding to one server (a TF Serving node or a peer sidecar) over gRPC and HTTP.

Requests and responses stay bytes: the channel has no (de)serializers, so what the
client sent is what the node reads, and what the node answered is what the client
reads. A gRPC error from upstream becomes the TfscacheError of the same code with
the same message, so it reaches the client unchanged.

Closing a channel ends the calls in flight on it with ``asyncio.CancelledError`` (not an
``AioRpcError``), and a call made on it afterwards raises ``grpc.aio.UsageError``. Both
become ``NodeUnavailable`` here, so the router retries the next replica: a stray
CancelledError escaping a front end's handler would leave its client waiting for its
whole deadline. A server dropped from the ring is ``retire``d: its channel closes once
the calls already on it have finished.

Streams (``stream``, ``rest_stream``) are async generators of what the server sends, as
it comes: nothing is read ahead of the caller, so a caller that stops reading stops this
side reading, and HTTP/2 or TCP flow control holds the server back. Closing one early
cancels the gRPC call or closes the HTTP connection, which is how a server learns that
the client went away.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import grpc

from tfscache import errors
from tfscache.kinds.channel import RECONNECT_OPTIONS, channel_ready
from tfscache.tls import PeerTls

log = logging.getLogger("tfscache.frontend.upstream")

# Request headers a client sends that must not be copied onto the hop to the node; the last, a
# peer's HAProxy's word that it sent this hop (backends.VIA_KEY), is of that hop alone.
_HOP_METADATA = {"user-agent", "te", "content-type", "grpc-accept-encoding", "grpc-encoding",
                 "grpc-timeout", "grpc-message-type", "host", "x-tfscache-via"}
# Reply headers passed back besides Content-Type: where the JSON header of the Open Inference
# Protocol's binary tensor extension ends in the body; a peer sidecar's load report (backends.LOAD_KEY,
# which PeerBackend takes off before the reply goes on).
_REPLY_HEADERS = ("Inference-Header-Content-Length", "Content-Encoding", "x-tfscache-load")


def forwardable_metadata(metadata) -> tuple[tuple[str, str | bytes], ...]:
    """The caller's own metadata (not gRPC's transport headers), to send on to the node."""
    if not metadata:
        return ()
    return tuple((key, value) for key, value in metadata
                 if not key.startswith(":") and key not in _HOP_METADATA)


# A peer that stops answering mid-call (its host cut off: no reset, packets just dropped) is
# found within about 3 s: a ping after 1 s without a frame from it, unanswered after 2 s more.
PEER_KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
)
# What a front end must allow for those pings (gRPC's default answers a ping more often than
# every 5 minutes without data with GOAWAY "too_many_pings", which would fail a long cold load).
PEER_PING_SERVER_OPTIONS = (("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
                            ("grpc.http2.max_ping_strikes", 0))


# The same for the REST hop, in TCP. Keep-alive probes (after 1 s of silence, every 1 s) find a
# host that stopped answering while a request waits for its reply; a healthy server's kernel answers
# them however long its handler takes. Probes only run while nothing sent is unacknowledged: a host
# cut off before it acknowledged the request's last bytes (servers delay that ACK by up to ~40 ms)
# would leave the kernel retransmitting for minutes. TCP_USER_TIMEOUT, 5 s without an ACK, ends
# both cases (with it set, it also decides when the unanswered probes give up): the request ends
# UNAVAILABLE, retried on another replica, 5 to ~10 s after the cut instead of at its timeout. It
# would also end a connection whose server kept its receive window shut for 5 s.
REST_KEEPALIVE = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 5000),
)


def _keepalive_socket(addr_info) -> socket.socket:
    family, kind, proto = addr_info[:3]
    sock = socket.socket(family=family, type=kind, proto=proto)
    for level, option, value in REST_KEEPALIVE:
        sock.setsockopt(level, option, value)
    return sock


def http_session() -> aiohttp.ClientSession:
    """The HTTP client of a front end's REST hops (nodes and peers): bytes as they came (no
    decompression, no added headers), unlimited connections, TCP keep-alive probes (``REST_KEEPALIVE``).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=None, socket_factory=_keepalive_socket
        ),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )


@dataclass(frozen=True)
class RestReply:
    """An HTTP answer passed back unchanged."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()  # those of _REPLY_HEADERS the server sent


class Upstream:
    """One channel to a server's gRPC port and a base URL for its REST port."""

    def __init__(self, grpc_address: str, rest_address: str | None, http: aiohttp.ClientSession, *,
                 max_send_bytes: int, max_receive_bytes: int, tls: PeerTls | None = None,
                 keepalive: bool = False) -> None:
        """``tls``: reach the server over TLS (a peer sidecar whose front ends use it); None: plaintext.
        ``keepalive``: while calls are in flight, ping the server (a peer sidecar, whose front end allows
        it: ``PEER_PING_SERVER_OPTIONS``) and end them UNAVAILABLE when it stops answering, so a peer
        cut off mid-call is retried on another replica instead of holding the call to its deadline.
        """
        self.grpc_address = grpc_address
        self.rest_address = rest_address
        self._http = http
        self._tls = tls
        options = [
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.enable_retries", 0),
            *RECONNECT_OPTIONS,
            *(PEER_KEEPALIVE_OPTIONS if keepalive else ()),
        ]
        if tls is None:
            self.channel = grpc.aio.insecure_channel(grpc_address, options=options)
        else:
            self.channel = grpc.aio.secure_channel(grpc_address, tls.channel_credentials(),
                                                   options=[*options, *tls.channel_options()])
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._in_flight = 0
        self._idle = asyncio.Event()  # set while no gRPC call is in flight
        self._idle.set()
        self._closed = False

    def __repr__(self) -> str:
        return f"Upstream(grpc={self.grpc_address}, rest={self.rest_address})"

    async def unary(self, path: str, request: bytes, *, metadata=(), timeout: float | None = None,
                    trailers: Callable[[tuple], None] | None = None) -> bytes:
        """Send ``request`` bytes to method ``path``; the response bytes, or the upstream's error.
        ``trailers(metadata)``: given the answer's trailing metadata, when the call succeeded."""
        if self._closed:
            raise errors.NodeUnavailable(f"the channel to {self.grpc_address} is closed")
        call = self._calls.get(path)
        if call is None:
            call = self._calls[path] = self.channel.unary_unary(path)
        self._in_flight += 1
        self._idle.clear()
        try:
            if trailers is None:
                return await call(request, timeout=timeout, metadata=metadata or None)
            running = call(request, timeout=timeout, metadata=metadata or None)
            response = await running
            trailers(await running.trailing_metadata())  # already received with the answer
            return response
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.grpc_address) from exc
        except grpc.aio.UsageError as exc:  # the channel was closed before the call started
            raise errors.NodeUnavailable(f"the channel to {self.grpc_address} is closed") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our own caller cancelled: let the cancellation through
            raise errors.NodeUnavailable(
                f"the call to {self.grpc_address} ended: its channel was closed "
                "(the server left the ring or stopped)"
            ) from None
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def stream(self, path: str, request: bytes, *, metadata=(),
                     timeout: float | None = None) -> AsyncIterator[bytes]:
        """Send ``request`` to the streaming method ``path`` (one request, then the half-close) and
        yield each response's bytes as it comes; closing the iteration early cancels the call."""
        if self._closed:
            raise errors.NodeUnavailable(f"the channel to {self.grpc_address} is closed")
        self._in_flight += 1
        self._idle.clear()
        call = None
        try:
            call = self.channel.unary_stream(path)(
                request, timeout=timeout, metadata=metadata or None
            )
            while (response := await call.read()) is not grpc.aio.EOF:
                yield response
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.grpc_address) from exc
        except grpc.aio.UsageError as exc:
            raise errors.NodeUnavailable(f"the channel to {self.grpc_address} is closed") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise errors.NodeUnavailable(
                f"the stream from {self.grpc_address} ended: its channel was closed "
                "(the server left the ring or stopped)"
            ) from None
        finally:
            if call is not None:
                call.cancel()  # no-op once it ended; else the server learns the client went away
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def rest_stream(self, method: str, path_qs: str, body: bytes, headers: dict[str, str], *,
                          timeout: float) -> AsyncIterator[RestReply | bytes]:
        """Send an HTTP request and yield the reply as it comes: first its head (a RestReply with no
        body), then each chunk of its body. ``timeout`` bounds the connection and each wait for the
        next chunk, not the whole reply. Closing the iteration early closes the connection."""
        if not self.rest_address:
            raise errors.NodeUnavailable(f"node {self.grpc_address} has no REST port")
        url = f"{'http' if self._tls is None else 'https'}://{self.rest_address}{path_qs}"
        tls = (
            {}
            if self._tls is None
            else {"ssl": self._tls.ssl_context, "server_hostname": self._tls.server_name}
        )
        try:
            async with self._http.request(
                method,
                url,
                data=body or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),
                allow_redirects=False,
                **tls,
            ) as reply:
                passed = [
                    h
                    for h in _REPLY_HEADERS
                    if h != "Content-Encoding" or not self._http.auto_decompress
                ]
                yield RestReply(
                    reply.status,
                    b"",
                    reply.headers.get("Content-Type", "application/json"),
                    tuple((h, reply.headers[h]) for h in passed if h in reply.headers),
                )
                async for chunk in reply.content.iter_any():
                    yield chunk
        except TimeoutError as exc:
            raise errors.DeadlineExceeded(
                f"REST stream from {self.rest_address} sent nothing for {timeout} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise errors.NodeUnavailable(
                f"REST stream from {self.rest_address} failed: {exc}"
            ) from exc

    async def rest(self, method: str, path_qs: str, body: bytes, headers: dict[str, str], *,
                   timeout: float) -> RestReply:
        """Send an HTTP request to the REST port; the reply is returned as it came."""
        if not self.rest_address:
            raise errors.NodeUnavailable(f"node {self.grpc_address} has no REST port")
        url = f"{'http' if self._tls is None else 'https'}://{self.rest_address}{path_qs}"
        tls = (
            {}
            if self._tls is None
            else {"ssl": self._tls.ssl_context, "server_hostname": self._tls.server_name}
        )
        try:
            async with self._http.request(method, url, data=body or None, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=timeout),
                                          allow_redirects=False, **tls) as reply:
                payload = await reply.read()
                # The body's Content-Encoding goes back only with the body as the server sent it.
                passed = [
                    h
                    for h in _REPLY_HEADERS
                    if h != "Content-Encoding" or not self._http.auto_decompress
                ]
                return RestReply(
                    reply.status,
                    payload,
                    reply.headers.get("Content-Type", "application/json"),
                    tuple((h, reply.headers[h]) for h in passed if h in reply.headers),
                )
        except TimeoutError as exc:
            raise errors.DeadlineExceeded(
                f"REST request to {self.rest_address} timed out after {timeout} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise errors.NodeUnavailable(
                f"REST request to {self.rest_address} failed: {exc}"
            ) from exc

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the gRPC channel to connect (the server listening again);
        False if it did not, or was closed meanwhile (its node's process replaced, a peer retired:
        grpc then ends ``channel_ready`` with a UsageError, which must not reach a request)."""
        if self._closed:
            return False
        try:
            return await channel_ready(self.channel, timeout)
        except grpc.aio.UsageError:  # closed while waiting
            return False

    async def retire(self, grace: float) -> None:
        """Close once the calls in flight have finished (at most ``grace`` s); calls may still start
        until then."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            log.info(
                "closing the channel to %s with %d call(s) still in flight after %.0f s",
                self.grpc_address,
                self._in_flight,
                grace,
            )
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.channel.close()


def _translate(exc: grpc.aio.AioRpcError, address: str) -> errors.TfscacheError:
    """The upstream's status as our error: same code, same message (TF Serving's text)."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        log.info("upstream %s unavailable: %s", address, details)
        return errors.NodeUnavailable(details)
    return errors.error_for_code(code, details)
