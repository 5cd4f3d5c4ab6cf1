"""The Open Inference Protocol's (KServe v2) REST API, served by tfscache.frontend.rest.RestFrontend.

URLs are matched with Triton's own patterns (http_server.cc) only to find the model
name and version for routing; bodies are not parsed. A request goes to the chosen
node's REST port with its body and its ``Content-Type``, ``Content-Encoding`` and
``Inference-Header-Content-Length`` headers unchanged (the binary tensor extension),
and the node's reply comes back with its status, body, ``Content-Type`` and
``Inference-Header-Content-Length`` unchanged.

* ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready`` and ``/v2/models/stats`` name no
  model: any healthy node answers (a sidecar's own node).
* ``GET /v2/models/NAME[/versions/V]`` (metadata), ``.../config``, ``.../stats`` and
  ``POST .../infer``, ``.../generate`` take a lease: the model loads.
* ``GET .../ready`` is a readiness probe and loads nothing: it is asked as gRPC ModelReady
  (``protocols/oip/methods``, ``probe``) and answered as Triton does, 200 with no body or 400
  ``{"error":"Model version not ready"}``.
* A model the repository lacks is asked of a node without a lease, for Triton's own 404; a
  version it lacks of a model it has is answered here as Triton serving that model answers
  (``protocols.oip.methods.unknown_version``).
* ``POST .../generate_stream`` streams the node's Server-Sent Events back as they come,
  under a lease (``protocols/oip/generate``).
* ``GET .../stats`` of a model that nodes hold already is gathered from all of them and
  merged, without a lease (``protocols/oip/stats``).
* ``/v2/repository/...`` is refused (400, ``methods.REPOSITORY_REFUSED``); shared
  memory, trace and log settings are not served (501).

Errors raised here are mapped in one place (``OipRestApi.error``) to the node kind's body,
``{"error":"<message>"}``, with the error's HTTP status and the Content-Type the kind's own server
sends for that URL: Triton 2.51 answers infer, generate and readiness errors, and URLs it does not
know, as ``text/plain`` and every other error as ``application/json`` (docs/triton.md, "Errors").
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import unquote

from aiohttp import web

from tfscache import errors, logs
from tfscache.frontend.backends import FORWARDED_KEY
from tfscache.frontend.grpc_server import REQUEST_ID_KEY, new_request_id
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.protocols.oip.methods import (
    METHODS,
    MODEL_READY_PATH,
    REPOSITORY_REFUSED,
    name_request,
    parse_version,
    read_ready,
    unknown_model,
    unknown_version,
)
from tfscache.frontend.rest import REQUEST_ID_HEADER
from tfscache.frontend.protocols.oip import server_metadata, stats
from tfscache.frontend.protocols.oip.generate import generate_stream
from tfscache.frontend.router import Router

log = logging.getLogger("tfscache.frontend.protocols.oip.rest")

_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
# a node kind whose versions have names (MLServer's parameters.version): any segment
_MODEL_NAMED = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?"
                          r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_UNSERVED = re.compile(r"/v2/(?:systemsharedmemory|cudasharedmemory|trace|logging)(?:/.*)?")
_ALL_STATS = "/v2/models/stats"
_FORWARD_HEADERS = (
    "Content-Type",
    "Accept",
    "Accept-Encoding",
    "Content-Encoding",
    "Inference-Header-Content-Length",
)
NOT_READY = "Model version not ready"
BINARY_HEADER = "Inference-Header-Content-Length"
BINARY_REFUSED = (
    "the binary tensor extension is not served by this kind of node: send the tensors as JSON "
    "(tritonclient.http: binary_data=False)"
)


@dataclass(frozen=True)
class OipRoute:
    """What a v2 URL names: the method it stands for, the HTTP method it takes, the model."""

    method: str  # the gRPC method's name (metrics count REST requests under it)
    http_method: str
    key: RouteKey | None = None


_SERVER_METHODS = {None: "ServerMetadata", "live": "ServerLive", "ready": "ServerReady"}
_MODEL_METHODS = {
    None: ("ModelMetadata", "GET"),
    "ready": ("ModelReady", "GET"),
    "config": ("ModelConfig", "GET"),
    "stats": ("ModelStatistics", "GET"),
    "infer": ("ModelInfer", "POST"),
    "generate": ("ModelGenerate", "POST"),
    "generate_stream": ("ModelGenerateStream", "POST"),
}


def parse_url(path: str, version_names: bool = False) -> OipRoute:
    """Triton's URL dispatch: the route, or NotFound "Not Found", or the refusal of an API not served.
    ``version_names``: a version that is not a number is a version name (``RouteKey.label``)."""
    if match := _SERVER.fullmatch(path):
        return OipRoute(_SERVER_METHODS[match.group(1)], "GET")
    if path == _ALL_STATS:
        return OipRoute("ModelStatistics", "GET")
    if match := (_MODEL_NAMED if version_names else _MODEL).fullmatch(path):
        name, version, kind = match.groups()
        if kind not in _MODEL_METHODS:
            raise errors.Unimplemented(f"{kind} is not served by tfscache")
        method, http_method = _MODEL_METHODS[kind]
        version = unquote(version or "")
        if version and not (version.isascii() and version.isdigit()):
            return OipRoute(method, http_method, RouteKey(unquote(name), label=version))
        return OipRoute(
            method, http_method, RouteKey(unquote(name), version=parse_version(version))
        )
    if _REPOSITORY.fullmatch(path):
        raise errors.FailedPrecondition(REPOSITORY_REFUSED)
    if _UNSERVED.fullmatch(path):
        raise errors.Unimplemented(
            "shared memory, trace and log settings are per node: tfscache routes each "
            "request to one of several nodes and does not serve them"
        )
    raise errors.NotFound("Not Found")


JSON, TEXT = "application/json", "text/plain"
# Triton 2.51 (http_server.cc) sends these methods' errors, and its URL errors, as text/plain;
# generate's and generate_stream's errors, as the rest, as application/json (measured: both)
_TEXT_ERRORS = frozenset({"ModelInfer", "ModelReady"})


def error_response(
    status: int, message: str, content_type: str = JSON, key: str = "error"
) -> web.Response:
    """The OIP REST error body ``{key: message}`` (compact, as Triton writes it), no charset."""
    return web.Response(
        status=status,
        body=json.dumps({key: message}, separators=(",", ":")).encode(),
        headers={"Content-Type": content_type},
    )


def _untyped(headers: dict[str, str]) -> bool:
    """A body sent without a type of its own: no Content-Type, or the form type ``curl -d`` puts
    on every body (an inference body is never a form)."""
    kind = headers.get("Content-Type", "").partition(";")[0].strip().lower()
    return kind in ("", "application/x-www-form-urlencoded")


class OipRestApi:
    """The /v2 URLs over the router; ``respond`` is RestFrontend's one handler for every request."""

    # What a node kind's variant of the protocol changes (tfscache.frontend.protocols.mlserver):
    # the binary tensor extension (Inference-Header-Content-Length) goes to the node
    binary_tensors = True
    default_content_type = ""  # a POST body without Content-Type goes with this one ("": none)
    # model URLs' methods the node does not have: 404 "Not Found", nothing loaded
    unserved = frozenset()
    unknown = staticmethod(unknown_model)  # a model the repository lacks, when no node answers
    # a version the repository lacks of a model it has: answered here in the node's words
    # (None: asked of a node without a lease, for its own answer)
    unknown_version = staticmethod(unknown_version)
    # versions that are not numbers are names the repository resolves (MLServer's version strings)
    version_names = False
    # the Content-Type of a method's errors written here: text/plain for these methods, else JSON
    text_errors = _TEXT_ERRORS
    ready_content_type = TEXT  # a ready model's 200, which has no body
    # a URL's errors (no such URL 404, a method not allowed 405): the Content-Type and body key
    url_error = (TEXT, "error")

    def error(self, method: str, status: int, message: str) -> web.Response:
        """An error written here for ``method``'s URL, as the node kind's server writes it."""
        return error_response(status, message, TEXT if method in self.text_errors else JSON)

    def url_error_response(self, status: int, message: str) -> web.Response:
        """The error of a URL the node does not serve or a method it does not take there."""
        content_type, key = self.url_error
        return error_response(status, message, content_type, key)

    def __init__(self, router: Router, *, max_receive_bytes: int, timeout_s: float) -> None:
        self._router = router
        self._max_receive = max_receive_bytes
        self._timeout_s = timeout_s

    async def respond(self, request: web.Request) -> tuple[web.StreamResponse, str]:
        """The response, and the method to count it under ("unknown" when the URL names none)."""
        path = request.raw_path.partition("?")[0]
        method = "unknown"
        request_id = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
        logs.bind(model=None, node=None, request_id=request_id)
        try:
            try:
                route = parse_url(path, self.version_names)
            except errors.NotFound as exc:  # no such URL
                return self.url_error_response(exc.http_status, exc.message), method
            method = route.method
            if request.method != route.http_method:
                return self.url_error_response(405, "Method Not Allowed"), method
            if route.method in self.unserved:
                return self.url_error_response(404, "Not Found"), method
            logs.bind(model=route.key.name if route.key is not None else None)
            response = await self._send(request, route, request_id)
        except errors.TfscacheError as exc:
            log.debug("%s %s: %s", request.method, path, exc.http_status)
            return self.error(method, exc.http_status, exc.message), method
        except Exception:  # noqa: BLE001 - the one place unknown errors become 500
            log.exception("%s %s failed", request.method, path)
            return self.error(method, 500, "internal error in tfscache front end"), method
        log.debug("%s %s: %s", request.method, path, response.status)
        return response, method

    async def _send(
        self, request: web.Request, route: OipRoute, request_id: str
    ) -> web.StreamResponse:
        forwarded = FORWARDED_KEY in request.headers
        if not self.binary_tensors and BINARY_HEADER in request.headers:
            raise errors.InvalidArgument(BINARY_REFUSED)
        key = route.key
        if key is not None and key.label is not None and self._router.resolves_labels:
            # a version name: routed to the version it names; the URL goes on as it came
            await self._router.read_labels(key.name)
            version = self._router.label_version(key.name, key.label)
            route = OipRoute(route.method, route.http_method, RouteKey(key.name, version=version))
        if route.method == "ModelReady":
            return await self._ready(route.key, request_id, forwarded, asked=key)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise errors.ResourceExhausted(
                f"request body larger than the limit of {self._max_receive} bytes"
            ) from exc
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        headers[REQUEST_ID_HEADER] = request_id
        if self.default_content_type and request.method == "POST" and _untyped(headers):
            headers["Content-Type"] = self.default_content_type

        def send(route_key: RouteKey | None):
            if route.method == "ModelGenerateStream":
                return generate_stream(
                    self._router,
                    request,
                    route_key,
                    body,
                    headers,
                    self._timeout_s,
                    forwarded,
                    {REQUEST_ID_HEADER: request_id},
                )
            if route.method == "ModelStatistics" and route_key is not None:
                return stats.rest_statistics(
                    self._router,
                    route_key,
                    request.raw_path,
                    headers,
                    self._timeout_s,
                    forwarded,
                    stats.is_held_only(request.headers.keys()),
                )
            return self._router.rest(
                route_key,
                request.method,
                request.raw_path,
                body,
                headers,
                self._timeout_s,
                forwarded=forwarded,
            )

        try:
            reply = await send(route.key)
        except errors.ModelNotFound as missing:
            if route.key is None:
                raise
            reply = await self._unknown(route.key, missing, send, route.method)
        if isinstance(reply, web.StreamResponse):  # a stream, relayed already
            return reply
        body = reply.body
        if route.method == "ServerMetadata" and reply.status == 200:
            body = server_metadata.served_rest(body)
        return web.Response(status=reply.status, body=body,
                            headers={"Content-Type": reply.content_type, **dict(reply.headers)})

    async def _ready(self, key: RouteKey, request_id: str, forwarded: bool,
                     asked: RouteKey | None = None) -> web.Response:
        """GET .../ready as gRPC ModelReady: the status probe that loads nothing; ``asked``: the
        key as the URL named it (a version name goes to the node as it came)."""
        deadline = time.monotonic() + self._timeout_s
        request, metadata = name_request(asked or key), ((REQUEST_ID_KEY, request_id),)

        def ask(route_key: RouteKey | None):
            return self._router.grpc(
                MODEL_READY_PATH,
                route_key,
                request,
                metadata,
                deadline,
                forwarded,
                probe=METHODS[MODEL_READY_PATH].probe,
            )

        try:
            reply = await ask(key)
        except errors.ModelNotFound as missing:
            reply = await self._unknown(key, missing, ask, "ModelReady")
        if read_ready(reply):
            typed = {"Content-Type": self.ready_content_type} if self.ready_content_type else {}
            return web.Response(status=200, headers=typed)
        return self.error("ModelReady", 400, NOT_READY)

    async def _unknown(self, key: RouteKey, missing: errors.ModelNotFound, send, method: str):
        """A model the repository lacks: a node's own answer, ``send(None)`` (no key: no lease; no
        node holds it, the cache alone loads), in Triton's words; those words made here when none
        answers. A version it lacks of a model it has: ``method``'s answer for a served model."""
        if isinstance(missing, errors.VersionNotFound) and self.unknown_version is not None:
            answer = self.unknown_version(method, key)
            if isinstance(answer, errors.TfscacheError):
                raise answer from missing
            return answer
        try:
            return await send(None)
        except (errors.Unavailable, errors.DeadlineExceeded):
            raise self.unknown(key) from missing
