"""``POST /v2/models/NAME[/versions/V]/generate_stream`` through the REST front end.

The request goes to the model's node under a lease (``tfscache.frontend.streams``), as an
infer does, and the node's Server-Sent Events come back as they come: each chunk the node
sends is written to the client before the next is read, so a slow client holds back the
node (TCP flow control) instead of making tfscache buffer. A reply that is not a 200 (an
unknown model's 404, a bad request's 400) comes back whole, as the node sent it.

The lease goes back when the node ends its reply, on an error, or when the client goes
away. A node that fails once events were sent (it died) ends the stream with one more
event, ``data: {"error":"<message>"}``, the form of Triton's own error events. A
disconnected client is noticed on the next write, or within ``_WATCH_S`` while
waiting for the node, and the connection to the node is then closed, which Triton passes
to the model as a cancellation. ``rest_timeout_s`` bounds the wait for the model (its load
included) and each wait for the node's next chunk, not the whole stream.

``generate`` (one response) is an ordinary REST request (``oip_rest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from aiohttp import web

from tfscache import errors
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.router import Router
from tfscache.frontend.streams import open_stream
from tfscache.frontend.upstream import RestReply

log = logging.getLogger("tfscache.frontend.protocols.oip.generate")

_WATCH_S = 0.2  # how often a stream waiting for its node looks whether its client is still there


async def generate_stream(router: Router, request: web.Request, key: RouteKey | None, body: bytes,
                          headers: dict[str, str], timeout: float, forwarded: bool,
                          reply_headers: dict[str, str]) -> web.StreamResponse:
    """Relay the node's streamed reply to ``request``'s client; ``reply_headers`` are added to it."""
    deadline = time.monotonic() + timeout

    def start(backend):
        return backend.rest_stream(key, request.method, request.raw_path, body, headers,
                                   max(0.001, deadline - time.monotonic()))

    async with contextlib.aclosing(open_stream(router, key, forwarded, deadline, start)) as parts:
        head: RestReply = await anext(parts)
        if head.status != 200:  # an error: whole, as it came
            rest = b"".join([chunk async for chunk in parts])
            return web.Response(
                status=head.status,
                body=rest,
                headers={"Content-Type": head.content_type, **dict(head.headers), **reply_headers},
            )
        response = web.StreamResponse(
            status=head.status,
            headers={"Content-Type": head.content_type, **dict(head.headers), **reply_headers},
        )
        await response.prepare(request)
        relay = asyncio.ensure_future(_relay(parts, response))
        watch = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not relay.done():
                relay.cancel()
                log.debug("generate_stream: the client went away; closing the node's stream")
            await asyncio.gather(relay, watch, return_exceptions=True)
        if relay.done() and not relay.cancelled() and relay.exception() is None:
            await response.write_eof()
        return response


async def _relay(parts, response: web.StreamResponse) -> None:
    sent = 0
    try:
        async for chunk in parts:
            await response.write(chunk)
            sent += 1
    except errors.TfscacheError as exc:  # the headers are sent: the error goes as the last event
        log.info("generate_stream ended early after %d chunk(s): %s", sent, exc.message)
        message = exc.message
        if isinstance(exc, errors.Unavailable):
            message = (
                f"the node serving this request became unavailable after {sent} chunk(s): {message}"
            )
        await response.write(
            b"data: " + json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n\n"
        )


async def _client_gone(request: web.Request) -> None:
    """Returns once the client's connection is closed."""
    while (transport := request.transport) is not None and not transport.is_closing():
        await asyncio.sleep(_WATCH_S)
