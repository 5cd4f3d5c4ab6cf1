"""Streams through the router: one request, 0..N messages back, relayed as they come.

``open_stream(router, key, forwarded, deadline, start)`` yields the messages of
``start(backend)``, a backend's stream (``Backend.stream`` or ``rest_stream``), from the
backend the router picks for ``key``. A node's stream holds its model's lease from
before the request is sent until its last message, its error, or the caller closing
the stream (its client went away, its deadline passed): a model with a stream open is
never unloaded, waits its turn under the caps like any leased model, and keeps a drain
waiting.

Until the first message the router's retries apply, as for a unary request (the node
is unavailable: the next replica, or a wait for it to restart). After it, the
messages already relayed cannot be taken back: an error ends the stream, raised to the
caller, which words it for its protocol.

Nothing is read ahead: the next message is asked of the node only when the caller has
taken the last one, so a slow client holds back the node (by HTTP/2 or TCP flow
control) rather than making this process buffer. A protocol that relays several
streams into one client stream bounds its own queue (``protocols/oip/stream.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from tfscache.frontend.methods import RouteKey
from tfscache.frontend.router import Router

_END = object()


async def open_stream(router: Router, key: RouteKey | None, forwarded: bool, deadline: float | None,
                      start: Callable[[object], AsyncIterator]) -> AsyncIterator:
    """The messages of ``start(backend)`` from the backend the router picks for ``key``.

    Use it as ``async with contextlib.aclosing(open_stream(...)) as messages``: closing it
    closes the backend's stream (and releases its lease) at once.
    """

    async def first_of(backend) -> tuple[object, AsyncIterator]:
        stream = start(backend)
        try:
            return await anext(stream, _END), stream
        except BaseException:
            await stream.aclose()
            raise

    first, stream = await router.open(key, forwarded, deadline, first_of)
    async with contextlib.aclosing(stream):
        if first is _END:
            return
        yield first
        async for message in stream:
            yield message
