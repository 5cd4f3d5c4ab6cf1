"""The gRPC methods the front end serves and how each one's routing key is read.

Only the ModelSpec is decoded, through tfscache.wire's minimal messages: field 1 is
``model_spec`` in PredictRequest, ClassificationRequest, RegressionRequest,
GetModelMetadataRequest and GetModelStatusRequest (``SpecHead``), and
MultiInferenceRequest's handle comes from ``tasks[0].model_spec``. The request
bytes themselves are forwarded unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


def _head(request: bytes) -> RouteKey | None:
    head = serving_pb2.SpecHead.FromString(request)
    return _spec_key(head.model_spec) if head.HasField("model_spec") else None


def _multi(request: bytes) -> RouteKey | None:
    head = serving_pb2.MultiInferenceHead.FromString(request)
    return _spec_key(head.tasks[0].model_spec) if head.tasks else None


@dataclass(frozen=True)
class Method:
    """One RPC: its full path and the function reading its routing key from request bytes."""

    path: str
    request_type: str
    read_key: Callable[[bytes], RouteKey | None]

    def route_key(self, request: bytes) -> RouteKey | None:
        """The request's RouteKey; None when it names no model (the node then reports TF's error)."""
        try:
            return self.read_key(request)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"Failed to parse request as {self.request_type}") from exc


def _method(service: str, name: str, request_type: str, read_key) -> Method:
    return Method(f"/{service}/{name}", f"tensorflow.serving.{request_type}", read_key)


METHODS: dict[str, Method] = {
    m.path: m for m in (
        _method(PREDICTION_SERVICE, "Predict", "PredictRequest", _head),
        _method(PREDICTION_SERVICE, "Classify", "ClassificationRequest", _head),
        _method(PREDICTION_SERVICE, "Regress", "RegressionRequest", _head),
        _method(PREDICTION_SERVICE, "MultiInference", "MultiInferenceRequest", _multi),
        _method(PREDICTION_SERVICE, "GetModelMetadata", "GetModelMetadataRequest", _head),
        _method(MODEL_SERVICE, "GetModelStatus", "GetModelStatusRequest", _head),
    )
}

RELOAD_PATH = f"/{MODEL_SERVICE}/HandleReloadConfigRequest"
STATUS_PATH = f"/{MODEL_SERVICE}/GetModelStatus"


def status_not_found(key: RouteKey) -> errors.NotFound:
    """GetModelStatus's NOT_FOUND texts (get_model_status_impl.cc) for a model not in the repository."""
    if key.version is not None:
        return errors.NotFound(f"Could not find version {key.version} of model {key.name}")
    return errors.NotFound(f"Could not find any versions of model {key.name}")
