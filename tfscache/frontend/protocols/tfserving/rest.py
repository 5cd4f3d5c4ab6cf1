"""TF Serving's REST API: its /v1/models URLs, bodies passed through to a node's REST port
(served by tfscache.frontend.rest.RestFrontend).

The URL is matched with TF Serving's own patterns (http_rest_api_util.cc) only to
find the model name and version for routing; the body is not parsed, and the node's
reply (status, body, content type) is returned unchanged. Errors raised here are
mapped in one place to ``{"error": "<message>"}`` with the error's HTTP status, as
TF Serving does; other paths get a plain 404 as from TF Serving's HTTP server.

A URL naming a version label (``/labels/L``) goes to the node as ``/versions/V``, the
version the label resolves to; a status request keeps its label, which TF Serving
ignores. Each request binds its log context here (model, request id from the
``X-Request-Id`` header or generated, sent on to the node or peer and back to the
caller in the reply's ``X-Request-Id`` header; the router adds the node). Each request is
timed and counted in ``RestFrontend._handle``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from urllib.parse import unquote

from aiohttp import web

from tfscache import errors, logs
from tfscache.frontend.backends import FORWARDED_KEY
from tfscache.frontend.grpc_server import new_request_id
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.protocols.tfserving.methods import status_not_found
from tfscache.frontend.protocols.tfserving.probe import rest_status
from tfscache.frontend.rest import REQUEST_ID_HEADER
from tfscache.frontend.router import Router

log = logging.getLogger("tfscache.frontend.protocols.tfserving.rest")

_V1 = re.compile(r"(?i)/v1/.*")
_POST = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)"
)
_GET = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?"
)
_FORWARD_HEADERS = ("Content-Type", "Accept")
# REST verbs counted under the name of the gRPC method they stand for.
_METHOD_NAMES = {"predict": "Predict", "classify": "Classify", "regress": "Regress",
                 "status": "GetModelStatus", "metadata": "GetModelMetadata"}


@dataclass(frozen=True)
class RestRoute:
    """What a TF Serving REST URL names."""

    key: RouteKey
    verb: str  # predict, classify, regress, status, metadata
    label_span: tuple[int, int] | None = None  # where "/labels/L" is in the path

    def with_version(self, path: str, version: int) -> tuple[RouteKey, str]:
        """The key and path with the label replaced by ``version`` (status keeps its label)."""
        if self.label_span is None or self.verb == "status":
            return self.key, path
        start, end = self.label_span
        return (
            RouteKey(self.key.name, version=version),
            f"{path[:start]}/versions/{version}{path[end:]}",
        )


def parse_url(method: str, path: str) -> RestRoute:
    """TF Serving's URL dispatch (http_rest_api_handler.cc): the route or its INVALID_ARGUMENT."""
    malformed = errors.InvalidArgument(f"Malformed request: {method} {path}")
    if method == "POST":
        match = _POST.fullmatch(path)
        if not match or match.group(4) not in ("classify", "regress", "predict"):
            raise malformed
        name, version, label, verb = match.groups()
    elif method == "GET":
        match = _GET.fullmatch(path)
        if not match:
            raise malformed
        name, version, label, metadata = match.groups()
        if metadata is not None and metadata != "metadata":
            raise malformed
        if not name:
            raise errors.InvalidArgument("Missing model name in request.")
        verb = "metadata" if metadata else "status"
    else:
        raise malformed
    if version is not None:
        number = int(version)
        if number >= 2**63:
            raise errors.InvalidArgument(f"Failed to convert version: {version} to numeric.")
        return RestRoute(RouteKey(unquote(name), version=number), verb)
    if label is None:
        return RestRoute(RouteKey(unquote(name)), verb)
    span = (match.start(3) - len("/labels/"), match.end(3))
    return RestRoute(RouteKey(unquote(name), label=unquote(label)), verb, span)


def error_response(exc: errors.TfscacheError) -> web.Response:
    """TF Serving's REST error body: the bare message under "error"."""
    body = json.dumps({"error": exc.message}, indent=4)
    return web.Response(status=exc.http_status, text=body, content_type="application/json")


class TfServingRestApi:
    """TF Serving's /v1 URLs over the router; ``respond`` is RestFrontend's one handler for every request."""

    def __init__(self, router: Router, *, max_receive_bytes: int, timeout_s: float) -> None:
        self._router = router
        self._max_receive = max_receive_bytes
        self._timeout_s = timeout_s

    async def respond(self, request: web.Request) -> tuple[web.StreamResponse, str]:
        """The response, and the method to count it under ("unknown" when the URL names none)."""
        path, sep, query = request.raw_path.partition("?")
        method = "unknown"
        if not _V1.fullmatch(path):
            return web.Response(status=404, text="Not Found"), method
        request_id = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
        logs.bind(model=None, node=None, request_id=request_id)
        try:
            route = parse_url(request.method, path)
            method = _METHOD_NAMES[route.verb]
            logs.bind(model=route.key.name)
            key, path_qs = route.key, request.raw_path
            if (
                route.label_span is not None
                and route.verb != "status"
                and self._router.resolves_labels
            ):
                await self._router.read_labels(key.name)  # labels.json, off the event loop
                key, node_path = route.with_version(
                    path, self._router.label_version(key.name, key.label)
                )
                path_qs = node_path + sep + query
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge as exc:
                raise errors.ResourceExhausted(
                    f"request body larger than the limit of {self._max_receive} bytes") from exc
            headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
            headers[REQUEST_ID_HEADER] = request_id
            forwarded = FORWARDED_KEY in request.headers
            try:
                reply = await self._router.rest(
                    key,
                    request.method,
                    path_qs,
                    body,
                    headers,
                    self._timeout_s,
                    forwarded=forwarded,
                    probe=rest_status if route.verb == "status" else None,
                )
            except errors.ModelNotFound as missing:
                # GET /v1/models/NAME[/versions/V]: GetModelStatus's texts
                if route.verb == "status":
                    raise status_not_found(key) from missing
                if route.verb == "metadata":
                    raise
                reply = await self._unknown_model(
                    missing, request.method, path_qs, body, headers, forwarded
                )
        except errors.TfscacheError as exc:
            log.debug("%s %s: %s", request.method, path, exc.http_status)
            return error_response(exc), method
        except Exception:  # noqa: BLE001 - the one place unknown errors become 500
            log.exception("%s %s failed", request.method, path)
            return error_response(errors.Internal("internal error in tfscache front end")), method
        log.debug("%s %s: %s", request.method, path, reply.status,
                  extra={"version": key.version})
        return web.Response(status=reply.status, body=reply.body,
                            headers={"Content-Type": reply.content_type}), method

    async def _unknown_model(
        self,
        missing: errors.ModelNotFound,
        method: str,
        path_qs: str,
        body: bytes,
        headers: dict[str, str],
        forwarded: bool,
    ):
        """TF Serving parses a predict/classify/regress body before it looks the model up, so bad
        JSON is 400 even for an unknown model: a node answers as it would (its JSON error, else
        the same 404; the cache, its config's only writer, never gave it that model)."""
        try:
            return await self._router.rest(
                None, method, path_qs, body, headers, self._timeout_s, forwarded=forwarded
            )
        except errors.TfscacheError as exc:
            log.debug(
                "no node to check the body of a request for an unknown model: %s", exc.message
            )
            raise missing from None
