"""The Open Inference Protocol as MLServer speaks it: ``PROTOCOL``, the OIP front end with its differences.

The gRPC methods and /v2 URLs are the Open Inference Protocol's (tfscache.frontend.protocols.oip),
routed and forwarded unchanged; what MLServer 1.7 does otherwise lives here, not in branches
of the OIP front end (docs/mlserver.md, "Differences from Triton"):

* no ModelConfig and no ModelStatistics (gRPC UNIMPLEMENTED, REST 404 "Not Found" on MLServer):
  tfscache answers the same without loading the model;
* no binary tensor extension over REST (MLServer refuses such a body, 422 "JSON decode error",
  after tfscache would have loaded the model): a request with ``Inference-Header-Content-Length``
  is INVALID_ARGUMENT (400) at once, saying to send JSON tensors;
* MLServer parses an infer body only with ``Content-Type: application/json`` (else 422): a POST
  without a Content-Type is sent with that one;
* a version is a name (``parameters.version`` in model-settings.json, such as ``v1``): one that
  is not a number is resolved by the repository (``RouteKey.label``) to the version it names, and
  the request goes on naming it as the client did; a name no version has is MLServer's NOT_FOUND
  "Model NAME with version V not found" (tfscache.kinds.mlserver.layout);
* every error MLServer writes is ``application/json`` (Triton writes some as text/plain), and
  FastAPI's own (no such URL, method not allowed) are ``{"detail": ...}``: so are tfscache's;
* a model it does not know is NOT_FOUND "Model NAME not found" (with a version: "Model NAME with
  version V not found"), MLServer's own words, which tfscache writes only when no node answers.
"""

from __future__ import annotations

import dataclasses

from tfscache import errors
from tfscache.frontend.methods import RouteKey, select_fields
from tfscache.frontend.protocol import Protocol
from tfscache.frontend.protocols.oip import methods as oip
from tfscache.frontend.protocols.oip.rest import JSON, OipRestApi
from tfscache.frontend.protocols.oip.stream import STREAMS
from tfscache.wire import oip_heads_pb2

_UNSERVED = ("ModelConfig", "ModelStatistics")


def unknown_model(key: RouteKey) -> errors.NotFound:
    """MLServer's NOT_FOUND text (mlserver.errors.ModelNotFound) for a model or version it lacks."""
    if key.version is None:
        return errors.NotFound(f"Model {key.name} not found")
    return errors.NotFound(f"Model {key.name} with version {key.version} not found")


def named_version_key(request: bytes) -> RouteKey | None:
    """The model and version a request names; a version that is not a number is a name."""
    head = oip_heads_pb2.ModelNameHead.FromString(select_fields(request, frozenset({1, 2})))
    if not head.name:
        return None
    if head.version and not (head.version.isascii() and head.version.isdigit()):
        return RouteKey(head.name, label=head.version)
    return RouteKey(head.name, version=oip.parse_version(head.version))


def _as_sent(request: bytes, resolve) -> bytes:
    """The request as the client sent it: MLServer wants its version's name, not the key."""
    return request


METHODS = {
    path: dataclasses.replace(
        method,
        # the methods naming a model (those with an unknown-model text) read version names
        read_key=named_version_key if method.unknown is not None else method.read_key,
        rewrite=_as_sent if method.unknown is not None else method.rewrite,
        unknown=unknown_model if method.unknown is not None else None,
        # MLServer words an unknown version itself
        unknown_version=None,
    )
    for path, method in oip.METHODS.items()
    if path.rpartition("/")[2] not in _UNSERVED
}
REFUSED = oip.REFUSED


class MLServerRestApi(OipRestApi):
    """The /v2 URLs in front of MLServer nodes."""

    binary_tensors = False
    default_content_type = "application/json"
    unserved = frozenset(_UNSERVED)
    unknown = staticmethod(unknown_model)
    unknown_version = None  # asked of a node, for MLServer's own words
    version_names = True
    text_errors = frozenset()  # MLServer writes every error as JSON
    url_error = (JSON, "detail")  # FastAPI's body for a URL or method it does not route
    ready_content_type = ""  # MLServer's ready 200 has no body and no Content-Type


PROTOCOL = Protocol(
    "Open Inference Protocol (MLServer)",
    METHODS,
    REFUSED,
    MLServerRestApi,
    ("", oip.SERVICE),
    grpc_streams=STREAMS,
    data_plane=oip.DATA_PLANE,
)
