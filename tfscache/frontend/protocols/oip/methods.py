"""The Open Inference Protocol (KServe v2) methods the front end serves, for Triton nodes.

``inference.GRPCInferenceService`` requests are routed by model name and version and
forwarded as bytes, unchanged, through the same router and backends as TF Serving's.
Only ``name = 1`` and ``version = 2`` are decoded (``ModelNameHead``): ModelReady,
ModelMetadata, ModelConfig and ModelStatistics requests are ``{name, version}``, and
ModelInferRequest has ``model_name = 1, model_version = 2`` (its tensors are skipped
unread, see ``methods.select_fields``). A version is a string, "" meaning the latest;
it is read as Triton reads it (``std::stol``) into ``RouteKey.version``, with Triton's
INVALID_ARGUMENT texts.

* ServerLive, ServerReady, ServerMetadata name no model: any healthy node answers (a
  sidecar's own node), as TF Serving's requests without a model. ServerMetadata's
  extensions are the node's less those not served here (``oip/server_metadata``). An empty
  model name (ModelStatistics' "all models") is answered the same way: by one node, for
  its models.
* ModelReady is a readiness probe and never loads or evicts (``frontend/probe.py``): a
  version on disk but on no node is ready (a request loads it), or not ready while its
  failed load backs off; a version loading or resident is answered by its node.
* ModelMetadata, ModelConfig, ModelStatistics and ModelInfer need the node to hold the
  model: they take a lease, so they load it. ModelStatistics for a model that nodes hold
  already is gathered from all of them and merged, without a lease (``protocols/oip/stats``).
* ModelStreamInfer is served by ``protocols/oip/stream`` (each streamed request leased by
  its own model).
* A model not in the repository is asked of a node without a lease, so the client gets
  Triton's own text (``Request for unknown model: 'X' is not found``, whatever version was
  asked); the same text is made here only when no node answers (``unknown_model``).
* A version not in the repository of a model that is there is answered here, as a Triton
  serving that model answers (``unknown_version``): a node's own answer would depend on
  whether it happens to hold the model now (one that never loaded it says "'X' is not
  found", one that did "'X' version N is not found").
* The repository extension is refused: the models a node holds are the cache's to
  decide (REPOSITORY_REFUSED; ``tfscache preload``/``evict`` on the admin port instead).
* Everything else (shared memory, trace and log settings) is not served: UNIMPLEMENTED,
  from gRPC itself.
"""

from __future__ import annotations

import re

from google.protobuf.message import DecodeError

from tfscache import errors
from tfscache.dataplane.config import Rules, grpc_rules, rest_rules
from tfscache.frontend.methods import Method, RouteKey, select_fields
from tfscache.frontend.probe import ProbeAnswer
from tfscache.frontend.protocols.oip import server_metadata, stats
from tfscache.wire import oip_heads_pb2

SERVICE = "inference.GRPCInferenceService"

# The data plane's hot method: ModelInferRequest's model_name = 1, model_version = 2 (a version
# named: the slow path); REST /v2/models/NAME/infer without a version.
DATA_PLANE = Rules(
    grpc=grpc_rules((f"/{SERVICE}/ModelInfer",), name=(1,), pins=(((2,), "-m len gt 0"),)),
    rest=rest_rules("^/v2/models/[^/]+/infer$", "path,field(4,/)"),
    rest_methods=(("infer", "ModelInfer"),),
)

MODEL_READY_PATH = f"/{SERVICE}/ModelReady"
REPOSITORY_PATHS = tuple(f"/{SERVICE}/{name}" for name in
                         ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"))
REPOSITORY_REFUSED = (
    "tfscache manages the models of its nodes: the model repository API is not accepted; "
    "a model loads on its first request (tfscache preload / evict on the admin port "
    "manage them by hand)"
)

_HEAD_FIELDS = frozenset({1, 2})
# std::stol: leading white space, a sign, digits; anything after them is ignored.
_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_LONG = 2**63


def parse_version(text: str) -> int | None:
    """A KServe version string as Triton reads it (GetModelVersionFromString): "" is the latest."""
    if not text:
        return None
    match = _STOL.match(text)
    if match is None or not -_LONG <= int(match.group(1)) < _LONG:
        raise errors.InvalidArgument(
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        )
    version = int(match.group(1))
    if version < 0:
        raise errors.InvalidArgument(f"invalid model version specified '{text}' , "
                                     "version should be an integral value > 0")
    return version


def _name_head(request: bytes) -> RouteKey | None:
    head = oip_heads_pb2.ModelNameHead.FromString(select_fields(request, _HEAD_FIELDS))
    if not head.name:
        return None  # the node answers: Triton's error, or (statistics) every model it holds
    return RouteKey(head.name, version=parse_version(head.version))


def _no_model(request: bytes) -> None:
    return None


def unknown_model(key: RouteKey) -> errors.NotFound:
    """Triton's NOT_FOUND text for a model it has never had (model_lifecycle.cc: the name is looked
    up before the version, so the text names no version)."""
    return errors.NotFound(f"Request for unknown model: '{key.name}' is not found")


def version_not_found(key: RouteKey) -> errors.NotFound:
    """Triton's NOT_FOUND text for a version a model it serves lacks (ModelLifecycle::GetModel)."""
    return errors.NotFound(
        f"Request for unknown model: '{key.name}' version {key.version} is not found"
    )


def statistics_version_unavailable(key: RouteKey) -> errors.InvalidArgument:
    """ModelStatistics' text for a version a model it serves lacks (tritonserver.cc)."""
    return errors.InvalidArgument(
        f"requested model version is not available for model '{key.name}'"
    )


def version_not_ready(key: RouteKey) -> bytes:
    """ModelReady's answer for a version a model it serves lacks: not ready."""
    return ready_response(False)


# A version the repository lacks of a model it has, answered as Triton serving that model answers
# (measured on tritonserver 2.51): by method name (the REST routes use the same names).
_UNKNOWN_VERSION = {
    "ModelInfer": version_not_found,
    "ModelMetadata": version_not_found,
    "ModelConfig": version_not_found,
    "ModelStatistics": statistics_version_unavailable,
    "ModelReady": version_not_ready,
}


def unknown_version(method: str, key: RouteKey) -> errors.TfscacheError | bytes:
    """Triton's answer to ``method`` (ModelInfer, ModelReady, ...) for a version missing from a model
    it serves: the error, or the response (ModelReady: not ready)."""
    return _UNKNOWN_VERSION.get(method, version_not_found)(key)


def ready_response(ready: bool) -> bytes:
    """A ModelReadyResponse (or ServerReady/ServerLive response) as bytes."""
    return oip_heads_pb2.ReadyHead(ready=ready).SerializeToString()


def read_ready(response: bytes) -> bool:
    """The bool of a ModelReadyResponse's bytes."""
    try:
        return oip_heads_pb2.ReadyHead.FromString(response).ready
    except DecodeError as exc:
        raise errors.Internal("a node sent a ModelReadyResponse that does not parse") from exc


def name_request(key: RouteKey) -> bytes:
    """A ModelReadyRequest (or Metadata/Config/Statistics request) for ``key``."""
    version = "" if key.version is None else str(key.version)
    if key.label is not None:  # a version's name, as the client wrote it
        version = key.label
    return oip_heads_pb2.ModelNameHead(name=key.name, version=version).SerializeToString()


def _ready_probe(answer: ProbeAnswer) -> bytes:
    """ModelReady's answer for a version a request would load (tfscache.frontend.probe)."""
    return ready_response(answer.failure is None)


def _method(name: str, read_key, probe=None, send=None) -> Method:
    if read_key is not _name_head:
        return Method(
            f"/{SERVICE}/{name}", f"inference.{name}Request", read_key, probe=probe, send=send
        )
    return Method(f"/{SERVICE}/{name}", f"inference.{name}Request", read_key, unknown=unknown_model,
                  unknown_version=lambda key: unknown_version(name, key), probe=probe, send=send)


METHODS: dict[str, Method] = {
    m.path: m for m in (
        _method("ServerLive", _no_model),
        _method("ServerReady", _no_model),
        _method("ServerMetadata", _no_model, send=server_metadata.grpc_server_metadata),
        _method("ModelReady", _name_head, _ready_probe),
        _method("ModelMetadata", _name_head),
        _method("ModelConfig", _name_head),
        _method("ModelStatistics", _name_head, send=stats.grpc_statistics),
        _method("ModelInfer", _name_head),
    )
}

REFUSED: dict[str, errors.TfscacheError] = {
    path: errors.FailedPrecondition(REPOSITORY_REFUSED) for path in REPOSITORY_PATHS}
