"""An aiohttp application served on one address: what the REST front end and the
metrics/status server share (and the node's REST API, through ``app_runner``).
Subclasses build the application in ``web_app()``.

Requests that do not parse as HTTP (aiohttp raises in its protocol, before any
handler runs) get their own status, not aiohttp's 400 for all: a request line over
``MAX_REQUEST_LINE`` bytes is 414, a header over ``MAX_HEADER_FIELD`` bytes or too
many headers 431, anything else 400. aiohttp logs each at ERROR with a traceback,
so any client could fill the log; here they are counted and reported in at most one
WARNING line per period per server (``REFUSAL_LOG_PERIOD_S``; ``tfscache serve``'s REST front end:
``server.refusal_log_period_s``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

log = logging.getLogger("tfscache.webserver")

MAX_REQUEST_LINE = 8190    # aiohttp's default max_line_size
# distinct from MAX_REQUEST_LINE: LineTooLong tells them apart by its limit
MAX_HEADER_FIELD = 16384
REFUSAL_LOG_PERIOD_S = 10.0
_REASONS = {400: "Bad Request", 414: "URI Too Long", 431: "Request Header Fields Too Large"}


def refusal_status(exc: HttpProcessingError) -> int:
    """The HTTP status for a request aiohttp could not parse."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        return 414 if limit == MAX_REQUEST_LINE else 431
    if "Too many headers" in str(exc.message):
        return 431
    return 400


class _RefusalLog:
    """Counts refused requests; one WARNING per period at most, with the count."""

    def __init__(self, what: str, period_s: float) -> None:
        self._what = what
        self._period_s = period_s
        self._counts: dict[int, int] = {}
        self._last_logged = float("-inf")
        self._pending: asyncio.TimerHandle | None = None

    def refused(self, status: int) -> None:
        self._counts[status] = self._counts.get(status, 0) + 1
        wait = self._last_logged + self._period_s - time.monotonic()
        if wait <= 0:
            self._flush()
        elif self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(wait, self._flush)

    def _flush(self) -> None:
        self._pending = None
        if not self._counts:
            return
        counts = ", ".join(f"{n} x {status} {_REASONS.get(status, '')}".rstrip()
                           for status, n in sorted(self._counts.items()))
        log.warning("%s refused malformed HTTP requests: %s", self._what, counts)
        self._counts.clear()
        self._last_logged = time.monotonic()


class _RequestHandler(web_protocol.RequestHandler):
    """aiohttp's protocol, answering unparsable requests itself (status, no traceback)."""

    refusals: _RefusalLog

    def handle_error(self, request, status=500, exc=None, message=None) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        status = refusal_status(exc)
        self.refusals.refused(status)
        response = web.Response(status=status, text=f"{status} {_REASONS[status]}\n")
        response.force_close()
        return response


class _Server(web_server.Server):
    """aiohttp's Server making ``_RequestHandler``s (aiohttp takes no handler class)."""

    refusals: _RefusalLog

    def __call__(self) -> web_protocol.RequestHandler:
        handler = _RequestHandler(self, loop=self._loop, **self._kwargs)
        handler.refusals = self.refusals
        return handler


class _AppRunner(web.AppRunner):

    def __init__(
        self, app: web.Application, what: str, refusal_log_period_s: float, **kwargs
    ) -> None:
        super().__init__(app, max_line_size=MAX_REQUEST_LINE, max_field_size=MAX_HEADER_FIELD,
                         **kwargs)
        self._what = what
        self._refusal_log_period_s = refusal_log_period_s

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only its protocol factory differs
        server.refusals = _RefusalLog(self._what, self._refusal_log_period_s)
        return server


def app_runner(
    app: web.Application, what: str, refusal_log_period_s: float = REFUSAL_LOG_PERIOD_S
) -> web.AppRunner:
    """An AppRunner for ``app`` that refuses unparsable requests quietly, counting them in one
    WARNING line per ``refusal_log_period_s`` at most (see above)."""
    return _AppRunner(app, what, refusal_log_period_s, access_log=None, handle_signals=False)


class WebServer:
    """``start()`` returns once serving, with the bound port (port 0 picks a free one)."""

    what = "HTTP server"  # for the log line

    def __init__(
        self,
        bind_address: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        *,
        reuse_port: bool = False,
        refusal_log_period_s: float = REFUSAL_LOG_PERIOD_S,
    ) -> None:
        self._bind = (bind_address, port)
        self._refusal_log_period_s = refusal_log_period_s
        # SO_REUSEPORT: worker processes share the port (tfscache.workers)
        self._reuse_port = reuse_port
        self._ssl_context = ssl_context  # HTTPS (tfscache.tls.ServerTls); None: plain HTTP
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def web_app(self) -> web.Application:
        raise NotImplementedError

    async def start(self) -> int:
        self._runner = app_runner(self.web_app(), self.what, self._refusal_log_period_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind[0], self._bind[1], reuse_port=self._reuse_port,
                           ssl_context=self._ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("%s serving on %s:%s", self.what, self._bind[0], self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
