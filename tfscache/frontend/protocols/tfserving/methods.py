"""The gRPC methods the front end serves and how each one's routing key is read.

Only the ModelSpec is decoded, through tfscache.wire's minimal messages: field 1 is
``model_spec`` in PredictRequest, ClassificationRequest, RegressionRequest,
GetModelMetadataRequest and GetModelStatusRequest (``SpecHead``), and
MultiInferenceRequest's handle comes from ``tasks[0].model_spec``. The request
bytes themselves are forwarded unchanged, except for a request naming a version
label: ``with_versions`` re-serialises it with the label replaced by the version it
resolves to (the node knows no labels; every other field passes through as an
unknown field of the minimal message, so nothing else changes in meaning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from google.protobuf.message import DecodeError

from tfscache import errors
from tfscache.wire import serving_pb2

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"

RELOAD_REFUSED = ("tfscache manages the model configs of its nodes: HandleReloadConfigRequest is not "
                  "accepted; put models in the model repository and request them by name")


@dataclass(frozen=True)
class RouteKey:
    """What routing needs from a request: the model name and the version asked for."""

    name: str
    version: int | None = None
    label: str | None = None


def _spec_key(spec: serving_pb2.ModelSpec) -> RouteKey | None:
    if not spec.name:
        return None
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return RouteKey(spec.name, version=spec.version.value)
    if choice == "version_label":
        return RouteKey(spec.name, label=spec.version_label)
    return RouteKey(spec.name)


def _records(request: bytes):
    """(field number, wire type, record start, payload start, record end) of each top-level field,
    in order; payloads are skipped unread."""
    view, pos, end = memoryview(request), 0, len(request)
    while pos < end:
        start = pos
        tag, pos = _varint(view, pos)
        field, wire_type = tag >> 3, tag & 7
        payload = pos
        if wire_type == 0:
            _, pos = _varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            size, payload = _varint(view, pos)
            pos = payload + size
        elif wire_type == 5:
            pos += 4
        else:  # groups (3, 4) do not occur in these messages; 6 and 7 are invalid
            raise DecodeError(f"unexpected wire type {wire_type}")
        if field == 0 or pos > end:
            raise DecodeError("truncated or invalid message")
        yield field, wire_type, start, payload, pos


def _field_one(request: bytes) -> list[memoryview]:
    """The payloads of every occurrence of length-delimited field 1, other fields skipped unread.

    Parsing the whole request would copy every other field (the tensors: up to the message
    size limit) into the parsed message's unknown fields; only the ModelSpec is needed.
    """
    view = memoryview(request)
    return [view[payload:end] for field, wire_type, _, payload, end in _records(request)
            if field == 1 and wire_type == 2]


def select_fields(request: bytes, fields: frozenset[int]) -> bytes:
    """The records of ``fields`` only (tags included, in order): a message a small head message
    parses as it would the whole request, without copying the fields it skips (the tensors)."""
    view = memoryview(request)
    return b"".join(view[start:end] for field, _, start, _, end in _records(request) if field in fields)


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise DecodeError("truncated varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _head(request: bytes) -> RouteKey | None:
    found = _field_one(request)
    if not found:
        return None
    spec = serving_pb2.ModelSpec()
    for payload in found:  # a repeated embedded message merges, as a full parse would
        spec.MergeFromString(payload)
    return _spec_key(spec)


def _multi(request: bytes) -> RouteKey | None:
    found = _field_one(request)  # tasks; the handle comes from tasks[0]
    if not found:
        return None
    return _spec_key(serving_pb2.InferenceTask.FromString(found[0]).model_spec)


LabelResolver = Callable[[str, str], int]  # (model name, label) -> version; raises TfscacheError


def _pin(spec: serving_pb2.ModelSpec, resolve: LabelResolver) -> None:
    version = resolve(spec.name, spec.version_label)
    spec.version.value = version  # setting the oneof's other member clears version_label


def _head_with_versions(request: bytes, resolve: LabelResolver) -> bytes:
    head = serving_pb2.SpecHead.FromString(request)
    _pin(head.model_spec, resolve)
    return head.SerializeToString()


def _multi_with_versions(request: bytes, resolve: LabelResolver) -> bytes:
    """Every task's label becomes its version. The first task's must resolve (its spec is the
    handle); TF Serving never reads a later task's version, so a later label that does not
    resolve is left for the node, which ignores it as TF Serving does."""
    head = serving_pb2.MultiInferenceHead.FromString(request)
    for index, task in enumerate(head.tasks):
        if task.model_spec.WhichOneof("version_choice") != "version_label":
            continue
        try:
            _pin(task.model_spec, resolve)
        except errors.TfscacheError:
            if index == 0:
                raise
    return head.SerializeToString()


@dataclass(frozen=True)
class Method:
    """One RPC: its full path and the functions reading its routing key from request bytes
    and replacing its version labels by versions."""

    path: str
    request_type: str
    read_key: Callable[[bytes], RouteKey | None]
    rewrite: Callable[[bytes, LabelResolver], bytes] | None = None  # None: labels are ignored
    # For a node that words its own "unknown model" errors (Triton): when the repository has no
    # such model, the request goes to a node without a lease for the node's answer; this error
    # when no node answers. None (TF Serving): the cache's error is the answer.
    unknown: Callable[[RouteKey], errors.TfscacheError] | None = None
    # How the request is answered, when not by ``Router.grpc`` (one node under a lease):
    # ``send(router, path, key, request, metadata, deadline, forwarded)`` -> response bytes.
    send: Callable[..., Awaitable[bytes]] | None = None

    def route_key(self, request: bytes) -> RouteKey | None:
        """The request's RouteKey; None when it names no model (the node then reports TF's error)."""
        try:
            return self.read_key(request)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"Failed to parse request as {self.request_type}") from exc

    def with_versions(self, request: bytes, key: RouteKey, resolve: LabelResolver) -> tuple[RouteKey, bytes]:
        """For a request naming a version label: its key and bytes with the label's version instead.

        Any other request (and GetModelStatus, which ignores labels as TF Serving does)
        comes back as it is, its bytes untouched.
        """
        if key is None or key.label is None or self.rewrite is None:
            return key, request
        version = resolve(key.name, key.label)

        def resolve_once(name: str, label: str) -> int:  # the bytes name the version the key routes to
            return version if (name, label) == (key.name, key.label) else resolve(name, label)

        try:
            request = self.rewrite(request, resolve_once)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"Failed to parse request as {self.request_type}") from exc
        return RouteKey(key.name, version=version), request


def _method(service: str, name: str, request_type: str, read_key, rewrite=None) -> Method:
    return Method(f"/{service}/{name}", f"tensorflow.serving.{request_type}", read_key, rewrite)


METHODS: dict[str, Method] = {
    m.path: m for m in (
        _method(PREDICTION_SERVICE, "Predict", "PredictRequest", _head, _head_with_versions),
        _method(PREDICTION_SERVICE, "Classify", "ClassificationRequest", _head, _head_with_versions),
        _method(PREDICTION_SERVICE, "Regress", "RegressionRequest", _head, _head_with_versions),
        _method(PREDICTION_SERVICE, "MultiInference", "MultiInferenceRequest", _multi, _multi_with_versions),
        _method(PREDICTION_SERVICE, "GetModelMetadata", "GetModelMetadataRequest", _head, _head_with_versions),
        _method(MODEL_SERVICE, "GetModelStatus", "GetModelStatusRequest", _head),  # labels ignored (§2)
    )
}

RELOAD_PATH = f"/{MODEL_SERVICE}/HandleReloadConfigRequest"
STATUS_PATH = f"/{MODEL_SERVICE}/GetModelStatus"


def status_not_found(key: RouteKey) -> errors.NotFound:
    """GetModelStatus's NOT_FOUND texts (get_model_status_impl.cc) for a model not in the repository."""
    if key.version is not None:
        return errors.NotFound(f"Could not find version {key.version} of model {key.name}")
    return errors.NotFound(f"Could not find any versions of model {key.name}")
