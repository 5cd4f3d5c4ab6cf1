"""The REST front end: one aiohttp server for a protocol's REST API (tfscache.frontend.protocol).

The protocol's API (``Protocol.rest_api``) matches the URLs, routes and maps its errors;
this server counts and times every request (``Metrics.begin`` / ``request``) and sends the
request id back in the ``X-Request-Id`` header, whatever the API; a (not streamed, not failed)
answer to a request a peer sidecar's Python front end forwarded also carries this sidecar's own
node's load (``x-tfscache-load``, docs/copies.md); one the peer's HAProxy sent
(``x-tfscache-via``) does not.
"""

from __future__ import annotations

from aiohttp import web

from tfscache import logs
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY, VIA_KEY
from tfscache.frontend.protocol import Protocol
from tfscache.frontend.router import Router
from tfscache.webserver import REFUSAL_LOG_PERIOD_S, WebServer

REQUEST_ID_HEADER = "X-Request-Id"


class RestFrontend(WebServer):
    """The aiohttp server; ``start()`` returns once serving with the bound port."""

    what = "REST front end"

    def __init__(
        self,
        router: Router,
        *,
        bind_address: str,
        port: int,
        max_receive_bytes: int,
        timeout_s: float,
        protocol: Protocol,
        metrics=None,
        ssl_context=None,
        reuse_port: bool = False,
        refusal_log_period_s: float = REFUSAL_LOG_PERIOD_S,
    ) -> None:
        """``protocol``: the API served (the node kind's); its ``rest_api(router, max_receive_bytes=,
        timeout_s=)`` answers every request. ``ssl_context``: HTTPS (``tfscache.tls.ServerTls``).
        ``refusal_log_period_s``: ``server.refusal_log_period_s``."""
        super().__init__(bind_address, port, ssl_context, reuse_port=reuse_port,
                         refusal_log_period_s=refusal_log_period_s)
        self._router = router
        # tfscache.observe.metrics.Metrics: requests counted by method and status
        self._metrics = metrics
        self._max_receive = max_receive_bytes
        self._api_respond = protocol.rest_api(router, max_receive_bytes=max_receive_bytes,
                                              timeout_s=timeout_s).respond

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_receive)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = self._metrics.begin() if self._metrics is not None else None
        logs.bind(model=None, node=None, request_id=None)
        response, method = await self._api_respond(request)
        request_id = logs.request_id.get() or request.headers.get(REQUEST_ID_HEADER)
        if request_id:  # the id the request was logged and forwarded with goes back
            response.headers[REQUEST_ID_HEADER] = request_id
        if (FORWARDED_KEY in request.headers and VIA_KEY not in request.headers
                and response.status < 400 and not response.prepared
                and (load := self._router.own_load()) is not None):
            response.headers[LOAD_KEY] = load  # for the forwarding peer's copies rule
        if self._metrics is not None:
            self._metrics.request("rest", method, str(response.status), started)
        return response
