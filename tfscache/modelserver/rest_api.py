"""TF Serving's REST API (/v1/models/...) over a ServingCore, as an aiohttp app.

A thin adapter, like ms/http_rest_api_handler.cc: the URL is matched with TF
Serving's own regexes, the body converted by json_tensor, the work done by
inference.py, the response written by json_response, and every error mapped in
one place (``_respond``) to ``{"error": "<message>"}`` with the error class's
HTTP status. Every /v1/ request is counted in TF Serving's request_count and, when it
succeeds, request_latency (entrypoint "REST"; serving_metrics.py), as ms/http_server.cc does.
With --monitoring_config_file the Prometheus page is served on its own path. A request runs in a
thread of its own pool, so JSON conversion and
Session.run never block the event loop that also serves gRPC.

Order of work for Predict, as TF Serving's: the URL, then the JSON, then the
model lookup (for the signature's inputs), then Predict itself. So over REST a
JSON error wins over NOT_FOUND, while over gRPC the model is looked up first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import time
from dataclasses import dataclass
from urllib.parse import unquote

from aiohttp import web
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from tfscache.errors import InvalidArgument, TfscacheError, code_name
from tfscache.modelserver import (
    inference,
    json_examples,
    json_response,
    json_tensor,
    serving_metrics,
)

log = logging.getLogger("tfscache.modelserver.rest_api")

# ms/http_rest_api_util.cc:31-34 and http_rest_api_util.h:33, matched in full.
_FLAGS = re.IGNORECASE | re.ASCII
_V1_PATH = re.compile(r"/v1/.*", _FLAGS)
_PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    _FLAGS)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:\/(metadata))?",
    _FLAGS)
_CORS_ORIGIN = re.compile(r"https?://")
_INT64_MAX = 2**63 - 1
_JSON_HEADERS = {"Content-Type": "application/json"}
# libevent's evhttp_send_error(req, HTTP_NOTFOUND, NULL) for paths outside /v1/.
_NOT_FOUND_PAGE = (b"<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n"
                   b"<H1>Not Found</H1>\n</BODY></HTML>\n")
_REASONS = {499: "Client Closed Request"}  # not in http.HTTPStatus
# TF Serving reads bodies of any size; protobuf messages stop at 2 GiB anyway.
_MAX_BODY = 2**31 - 1
INTERNAL_ERROR_MESSAGE = "Internal error while processing the request; see the node's log."


@dataclass
class _Target:
    """What the URL names: ParseModelInfo's outputs."""

    name: str = ""
    version: int | None = None
    label: str | None = None
    method: str = ""       # classify / regress / predict, as written in the URL
    subresource: str = ""  # "metadata" or ""

    def model_spec(self) -> model_pb2.ModelSpec:
        """FillModelSpecWithNameVersionAndLabel (the regexes never give both)."""
        spec = model_pb2.ModelSpec(name=self.name)
        if self.version is not None:
            spec.version.value = self.version
        if self.label is not None:
            spec.version_label = self.label
        return spec


def _parse_path(http_method: str, path: str) -> _Target | None:
    """ParseModelInfo: the target, None when the URL does not match its method's regex."""
    regex = {"POST": _PREDICTION_PATH, "GET": _STATUS_PATH}.get(http_method)
    match = regex.fullmatch(path) if regex is not None else None
    if match is None:
        return None
    name, version, label, last = match.groups(default="")
    target = _Target(name=unquote(name))
    if http_method == "POST":
        target.method = last
    else:
        target.subresource = last
    if version:
        number = int(version)
        if number > _INT64_MAX:
            raise InvalidArgument(f"Failed to convert version: {version} to numeric.")
        target.version = number
    if label:
        target.label = unquote(label)
    return target


class RestHandler:
    """HttpRestApiHandler: one blocking ``process`` per request (run in a thread)."""

    def __init__(self, core, timeout_ms: int = 30000, max_tensor_bytes: int | None = None) -> None:
        self.core = core
        self.max_tensor_bytes = max_tensor_bytes  # --max_request_tensor_bytes (tensor_limits)
        # --rest_api_timeout_in_ms: RunOptions.timeout_in_ms when positive.
        self.timeout_s = timeout_ms / 1000 if timeout_ms > 0 else None

    def process(self, http_method: str, path: str, body: bytes) -> str:
        """ProcessRequest: the JSON response body, or a TfscacheError."""
        target = _parse_path(http_method, path)
        if target is not None and http_method == "POST":
            processor = {"classify": self.classify, "regress": self.regress,
                         "predict": self.predict}.get(target.method)
            if processor is not None:  # ":PREDICT" matches the regex but not this
                return processor(target, body)
        elif target is not None and http_method == "GET":
            if target.subresource == "metadata":
                return self.metadata(target)
            return self.status(target)
        raise InvalidArgument(f"Malformed request: {http_method} {path}")

    def predict(self, target: _Target, body: bytes) -> str:
        request = predict_pb2.PredictRequest(model_spec=target.model_spec())
        doc = json_tensor.parse_json(body)
        request.model_spec.signature_name = json_tensor.signature_name(doc)
        inputs = self._signature_inputs(request.model_spec)
        tensors, fmt = json_tensor.predict_inputs(doc, inputs, request.model_spec.signature_name,
                                                  self.max_tensor_bytes)
        for name, tensor in tensors.items():
            request.inputs[name].CopyFrom(tensor)
        response = inference.predict(self.core, request, self.timeout_s, self.max_tensor_bytes)
        return json_response.predict_json(response.outputs, fmt)

    def _signature_inputs(self, model_spec: model_pb2.ModelSpec):
        """GetInfoMap: the signature's inputs, through a handle on the servable."""
        with self.core.servable(model_spec) as servable:
            name = model_spec.signature_name or inference.DEFAULT_SIGNATURE
            signature = servable.signature_defs.get(name)
            if signature is None:
                raise InvalidArgument(
                    f'Serving signature name: "{name}" not found in signature def'
                )
            return dict(signature.inputs)

    def classify(self, target: _Target, body: bytes) -> str:
        request = classification_pb2.ClassificationRequest(model_spec=target.model_spec())
        json_examples.fill_example_request(json_tensor.parse_json(body), request)
        response = inference.classify(self.core, request, self.timeout_s)
        return json_response.classification_json(response.result)

    def regress(self, target: _Target, body: bytes) -> str:
        request = regression_pb2.RegressionRequest(model_spec=target.model_spec())
        json_examples.fill_example_request(json_tensor.parse_json(body), request)
        response = inference.regress(self.core, request, self.timeout_s)
        return json_response.regression_json(response.result)

    def status(self, target: _Target) -> str:
        if not target.name:
            raise InvalidArgument("Missing model name in request.")
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=target.model_spec())
        return json_response.status_json(self.core.status(request))

    def metadata(self, target: _Target) -> str:
        if not target.name:
            raise InvalidArgument("Missing model name in request.")
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=target.model_spec(), metadata_field=[inference.SIGNATURE_DEF_FIELD])
        return json_response.metadata_json(inference.get_model_metadata(self.core, request))


def _respond(handler: RestHandler, http_method: str, path: str, body: bytes) -> tuple[int, str]:
    """The one place where REST errors become responses; each request is counted."""
    start = time.perf_counter()
    code = "OK"
    try:
        return 200, handler.process(http_method, path, body)
    except TfscacheError as exc:
        log.debug("REST %s %s failed: %r", http_method, path, exc)
        code = code_name(exc.grpc_code)
        return exc.http_status, json_response.error_json(exc.message)
    except Exception:
        log.exception("REST %s %s failed with an unexpected error", http_method, path)
        code = "INTERNAL"
        return 500, json_response.error_json(INTERNAL_ERROR_MESSAGE)
    finally:
        serving_metrics.record_request(*_metric_labels(http_method, path), "REST", code, start)


def _metric_labels(http_method: str, path: str) -> tuple[str, str]:
    """The model_name and API ParseModelInfo gives the metrics ("" where the URL names none)."""
    regex = {"POST": _PREDICTION_PATH, "GET": _STATUS_PATH}.get(http_method)
    match = regex.fullmatch(path) if regex is not None else None
    if match is None:
        return "", ""
    return unquote(match.group(1) or ""), match.group(4) if http_method == "POST" else ""


def _json_response(status: int, text: str) -> web.Response:
    try:  # strings from the request or the model go back as the bytes they were
        body = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate escape such as "\\ud800"
        body = text.encode("utf-8", "replace")
    return web.Response(status=status, reason=_REASONS.get(status), body=body,
                        headers=_JSON_HEADERS)


def make_rest_app(
    core,
    *,
    timeout_ms: int = 30000,
    threads: int | None = None,
    max_tensor_bytes: int | None = None,
    metrics_path: str | None = None,
) -> web.Application:
    """The REST API of a node: TF Serving's URLs, bodies, errors and HTTP codes.

    ``metrics_path``: serve the Prometheus page there (any method, as TF Serving's
    registered handler), before the /v1/ dispatcher."""
    handler = RestHandler(core, timeout_ms, max_tensor_bytes)
    pool = concurrent.futures.ThreadPoolExecutor(
        threads or max(4, 4 * (os.cpu_count() or 1)), thread_name_prefix="tfscache-rest")

    async def dispatch(request: web.Request) -> web.Response:
        path = request.rel_url.raw_path  # matched and reported undecoded, as evhttp's uri_path
        if metrics_path is not None and path == metrics_path:  # thousands of series: off the loop
            page = await asyncio.get_running_loop().run_in_executor(
                pool, serving_metrics.prometheus_page
            )
            return web.Response(body=page.encode(), headers={"Content-Type": "text/plain"})
        if not _V1_PATH.fullmatch(path):
            return web.Response(status=404, body=_NOT_FOUND_PAGE,
                                headers={"Content-Type": "text/html; charset=ISO-8859-1"})
        if request.method == "OPTIONS":  # CORS preflight: an empty body either way
            ok = bool(_CORS_ORIGIN.search(request.headers.get("Origin", "")))
            serving_metrics.record_request("", "", "REST", "OK" if ok else "FAILED_PRECONDITION",
                                      time.perf_counter())
            return web.Response(status=200 if ok else 400)
        body = await request.read()
        loop = asyncio.get_running_loop()
        status, text = await loop.run_in_executor(
            pool, _respond, handler, request.method, path, body)
        return _json_response(status, text)

    async def shutdown(app: web.Application) -> None:
        pool.shutdown(wait=False, cancel_futures=True)

    app = web.Application(client_max_size=_MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    app.on_cleanup.append(shutdown)
    return app
