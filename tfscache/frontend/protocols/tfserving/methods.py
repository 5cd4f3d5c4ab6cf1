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


from tfscache import errors
from tfscache.frontend.methods import LabelResolver, Method, RouteKey, field_one
from tfscache.frontend.protocols.tfserving.probe import grpc_status
from tfscache.wire import serving_pb2

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"

RELOAD_REFUSED = (
    "tfscache manages the model configs of its nodes: HandleReloadConfigRequest is not "
    "accepted; put models in the model repository and request them by name"
)


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
    found = field_one(request)
    if not found:
        return None
    spec = serving_pb2.ModelSpec()
    for payload in found:  # a repeated embedded message merges, as a full parse would
        spec.MergeFromString(payload)
    return _spec_key(spec)


def _multi(request: bytes) -> RouteKey | None:
    found = field_one(request)  # tasks; the handle comes from tasks[0]
    if not found:
        return None
    return _spec_key(serving_pb2.InferenceTask.FromString(found[0]).model_spec)


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


def status_not_found(key: RouteKey) -> errors.NotFound:
    """GetModelStatus's NOT_FOUND texts (get_model_status_impl.cc) for a model not in the repository."""
    if key.version is not None:
        return errors.NotFound(f"Could not find version {key.version} of model {key.name}")
    return errors.NotFound(f"Could not find any versions of model {key.name}")


def _method(service: str, name: str, request_type: str, read_key, rewrite=None, **status) -> Method:
    return Method(
        f"/{service}/{name}", f"tensorflow.serving.{request_type}", read_key, rewrite, **status
    )


METHODS: dict[str, Method] = {
    m.path: m
    for m in (
        _method(PREDICTION_SERVICE, "Predict", "PredictRequest", _head, _head_with_versions),
        _method(
            PREDICTION_SERVICE, "Classify", "ClassificationRequest", _head, _head_with_versions
        ),
        _method(PREDICTION_SERVICE, "Regress", "RegressionRequest", _head, _head_with_versions),
        _method(
            PREDICTION_SERVICE,
            "MultiInference",
            "MultiInferenceRequest",
            _multi,
            _multi_with_versions,
        ),
        _method(
            PREDICTION_SERVICE,
            "GetModelMetadata",
            "GetModelMetadataRequest",
            _head,
            _head_with_versions,
        ),
        _method(
            MODEL_SERVICE,
            "GetModelStatus",
            "GetModelStatusRequest",
            _head,  # labels ignored
            probe=grpc_status,
            not_found=status_not_found,
        ),
    )
}

RELOAD_PATH = f"/{MODEL_SERVICE}/HandleReloadConfigRequest"
STATUS_PATH = f"/{MODEL_SERVICE}/GetModelStatus"
# Methods answered with an error and never forwarded: TF Serving's config reload.
REFUSED: dict[str, errors.TfscacheError] = {RELOAD_PATH: errors.FailedPrecondition(RELOAD_REFUSED)}
