"""PredictionService on a ServingCore: TF Serving's checks, in TF Serving's order.

Each function takes the parsed tensorflow_serving request, resolves the servable
with ``core.servable(model_spec)`` (held for the whole request, so an unload waits
for it) and returns the response or raises a ``TfscacheError`` with TF Serving's
code and text (docs/upstream/tfserving.md, "Predict" to "GetModelMetadata"; upstream
tensorflow_serving/servables/tensorflow/: predict_util.cc, classifier.cc, regressor.cc,
multi_inference.cc, util.cc, get_model_metadata_impl.cc). Signatures are validated
structurally, as with the default ``--enable_signature_method_name_check=false``. Session
runs are timed in TF Serving's runtime_latency and MultiInference's examples counted
(serving_metrics.py).
"""

from __future__ import annotations

import logging

import numpy as np
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    inference_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from tfscache import errors
from tfscache.modelserver import serving_metrics, tensor_limits
from tfscache.modelserver.example_results import (
    classification_result,
    classification_targets,
    regression_result,
    regression_targets,
    serialized_examples,
)
from tfscache.modelserver.servable import from_proto, to_proto_field

log = logging.getLogger("tfscache.modelserver.inference")

DEFAULT_SIGNATURE = "serving_default"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
SIGNATURE_DEF_FIELD = "signature_def"


# -- Predict -----------------------------------------------------------------------------


def predict(core, request: predict_pb2.PredictRequest, timeout_s: float | None = None,
            max_tensor_bytes: int | None = None) -> predict_pb2.PredictResponse:
    """``max_tensor_bytes``: the bound on the inputs' decoded size (None: no bound)."""
    if not request.HasField("model_spec"):
        raise errors.InvalidArgument("Missing ModelSpec")
    spec = request.model_spec
    with core.servable(spec) as servable:
        signature_name = spec.signature_name or DEFAULT_SIGNATURE
        signature = _signature(servable, signature_name)
        if signature is None:
            raise errors.FailedPrecondition(f'Serving signature key "{signature_name}" not found.')
        response = predict_pb2.PredictResponse()
        _model_spec(response.model_spec, spec.name, signature_name, servable.version)
        _check_input_size(signature, request)
        tensor_limits.check_inputs(request.inputs, max_tensor_bytes)  # before any decoding
        feeds = _input_values(signature, request.inputs)
        names, aliases = _output_targets(signature, request.output_filter)
        with serving_metrics.runtime_latency(spec.name, "Predict"):
            outputs = servable.run(feeds, names, timeout_s)
        if len(outputs) != len(aliases):
            raise errors.Unknown("Predict internal error")
        for alias, value in zip(aliases, outputs):
            to_proto_field(value, response.outputs[alias])
        return response


def _check_input_size(signature, request) -> None:
    sent, wanted = len(request.inputs), len(signature.inputs)
    if sent > wanted or (sent < wanted and not signature.defaults):
        req_keys, sig_keys = set(request.inputs), set(signature.inputs)
        raise errors.InvalidArgument(
            f"input size does not match signature: {sent}!={wanted} "
            f"len({{{_join(req_keys)}}}) != len({{{_join(sig_keys)}}}). "
            f"Sent extra: {{{_join(req_keys - sig_keys)}}}. "
            f"Missing but required: {{{_join(sig_keys - req_keys)}}}.")


def _input_values(signature, request_inputs) -> dict[str, np.ndarray]:
    """TF's saved_model::GetInputValues: tensor name -> value, defaults filled in."""
    feeds: dict[str, np.ndarray] = {}
    seen = set()
    for alias in sorted(signature.inputs):
        feed_name = signature.inputs[alias].name
        if alias in request_inputs:
            proto = request_inputs[alias]
            seen.add(alias)
        elif alias in signature.defaults:
            proto = signature.defaults[alias]
        else:
            raise errors.InvalidArgument(
                f"Signature input alias: {alias}(feed name: {feed_name}) not found in "
                "request and no default value provided. Inputs expected to be in the "
                f"request {{{_join(request_inputs)}}}, or default input alias set: "
                f"{_join(signature.defaults)}")
        value = from_proto(proto)
        if value is None:
            raise errors.InvalidArgument(f"tensor parsing error: {alias}")
        feeds[feed_name] = value
    if request_inputs and len(seen) != len(request_inputs):
        raise errors.InvalidArgument(
            f"Inputs contains invalid name. Used request inputs: {_join(seen)}, "
            f"request input: {_join(request_inputs)}")
    return feeds


def _output_targets(signature, output_filter) -> tuple[list[str], list[str]]:
    names, aliases = [], []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise errors.InvalidArgument(
                f"output tensor alias not found in signature: {alias} Outputs expected "
                f"to be in the set {{{_join(signature.outputs)}}}.")
        if alias in aliases:
            raise errors.InvalidArgument(f"duplicate output tensor alias: {alias}")
        names.append(signature.outputs[alias].name)
        aliases.append(alias)
    if not names:
        for alias in sorted(signature.outputs):
            names.append(signature.outputs[alias].name)
            aliases.append(alias)
    return names, aliases


# -- Classify / Regress ------------------------------------------------------------------


def classify(core, request: classification_pb2.ClassificationRequest,
             timeout_s: float | None = None) -> classification_pb2.ClassificationResponse:
    if not request.HasField("model_spec"):
        raise errors.InvalidArgument("Missing ModelSpec")
    spec = request.model_spec
    with core.servable(spec) as servable:
        signature = _example_signature(servable, spec.signature_name)
        input_name, output_names = classification_targets(signature)
        response = classification_pb2.ClassificationResponse()
        _model_spec(response.model_spec, spec.name, spec.signature_name, servable.version)
        examples = serialized_examples(request.input)
        with serving_metrics.runtime_latency(spec.name, "Classify"):
            outputs = servable.run({input_name: examples}, output_names, timeout_s)
        classification_result(signature, len(examples), output_names, outputs, response.result)
        return response


def regress(core, request: regression_pb2.RegressionRequest,
            timeout_s: float | None = None) -> regression_pb2.RegressionResponse:
    if not request.HasField("model_spec"):
        raise errors.InvalidArgument("Missing ModelSpec")
    spec = request.model_spec
    with core.servable(spec) as servable:
        signature = _example_signature(servable, spec.signature_name, regression=True)
        input_name, output_names = regression_targets(signature)
        response = regression_pb2.RegressionResponse()
        _model_spec(response.model_spec, spec.name, spec.signature_name, servable.version)
        examples = serialized_examples(request.input)
        with serving_metrics.runtime_latency(spec.name, "Regress"):
            outputs = servable.run({input_name: examples}, output_names, timeout_s)
        regression_result(signature, len(examples), output_names, outputs, response.result)
        return response


def _example_signature(servable, requested: str, *, regression: bool = False):
    """GetClassificationSignatureDef / GetRegressionSignatureDef."""
    name = requested or DEFAULT_SIGNATURE
    signature = _signature(servable, name)
    if signature is None:
        raise errors.InvalidArgument(f"No signature was found with the name: {name}")
    (regression_targets if regression else classification_targets)(signature)
    return signature


# -- MultiInference ----------------------------------------------------------------------


def multi_inference(core, request: inference_pb2.MultiInferenceRequest,
                    timeout_s: float | None = None) -> inference_pb2.MultiInferenceResponse:
    # No "Missing ModelSpec" check: the handle comes from the first task's spec, or an
    # empty spec (-> "ModelSpec has no name specified.").
    if request.tasks and request.tasks[0].HasField("model_spec"):
        spec = request.tasks[0].model_spec
    else:
        spec = model_pb2.ModelSpec()
    with core.servable(spec) as servable:
        model_name = ""
        signature_names: set[str] = set()
        input_names: set[str] = set()
        output_names: set[str] = set()
        for task in request.tasks:
            if not task.model_spec.name:
                raise errors.InvalidArgument("Found ModelSpec with an empty model name.")
            if not model_name:
                model_name = task.model_spec.name
            elif model_name != task.model_spec.name:
                raise errors.InvalidArgument(
                    "All ModelSpecs in a MultiInferenceRequest must access the same model name.")
            signature_name = task.model_spec.signature_name or DEFAULT_SIGNATURE
            if signature_name in signature_names:
                raise errors.InvalidArgument(f"Duplicate evaluation of signature: {signature_name}")
            signature_names.add(signature_name)
            signature = _signature(servable, signature_name)
            if signature is None:
                raise errors.InvalidArgument(
                    f"Requested signature not found in model graph: {signature_name}")
            if task.method_name == CLASSIFY_METHOD:
                input_name, names = classification_targets(signature)
            elif task.method_name == REGRESS_METHOD:
                input_name, names = regression_targets(signature)
            else:
                raise errors.Unimplemented(f"Unsupported signature method_name: {task.method_name}")
            input_names.add(input_name)
            output_names.update(names)

        fetches = sorted(output_names)
        examples = serialized_examples(request.input)
        outputs = servable.run({name: examples for name in sorted(input_names)}, fetches, timeout_s)
        serving_metrics.record_examples(model_name, len(examples))

        response = inference_pb2.MultiInferenceResponse()
        for task in request.tasks:
            signature = _signature(servable, task.model_spec.signature_name or DEFAULT_SIGNATURE)
            result = response.results.add()
            if task.method_name == CLASSIFY_METHOD:
                classification_result(signature, len(examples), fetches, outputs,
                                       result.classification_result)
            else:
                regression_result(signature, len(examples), fetches, outputs,
                                   result.regression_result)
            _model_spec(result.model_spec, task.model_spec.name,
                        task.model_spec.signature_name, servable.version)
        return response


# -- GetModelMetadata --------------------------------------------------------------------


def get_model_metadata(
    core, request: get_model_metadata_pb2.GetModelMetadataRequest, timeout_s: float | None = None
) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """``timeout_s`` is accepted for a uniform adapter signature; nothing runs a session."""
    if not request.HasField("model_spec"):
        raise errors.InvalidArgument("Missing ModelSpec")
    if not request.metadata_field:
        raise errors.InvalidArgument(
            "GetModelMetadataRequest must specify at least one metadata_field")
    for field in request.metadata_field:
        if field != SIGNATURE_DEF_FIELD:
            raise errors.InvalidArgument(f"Metadata field {field} is not supported")
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    with core.servable(request.model_spec) as servable:
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, signature in servable.meta_graph_def.signature_def.items():
            signature_map.signature_def[key].CopyFrom(signature)
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
    return response


# -- helpers -----------------------------------------------------------------------------


def _signature(servable, name: str):
    signatures = servable.meta_graph_def.signature_def
    return signatures[name] if name in signatures else None


def _model_spec(target: model_pb2.ModelSpec, name: str, signature_name: str, version: int) -> None:
    """MakeModelSpec: the requested name, the signature with the default filled in, the
    loaded numeric version; never the label."""
    target.Clear()
    target.name = name
    target.signature_name = signature_name or DEFAULT_SIGNATURE
    target.version.value = version


def _join(keys) -> str:
    return ",".join(sorted(keys))
