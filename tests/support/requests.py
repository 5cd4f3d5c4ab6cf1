"""TF Serving's request messages (tensorflow_serving.apis protos), built the way the tests send them.

    from support.requests import predict_request

    stub.Predict(predict_request("addk_1", 1.0), timeout=60)           # x = [1.0]
    stub.Predict(predict_request("half_plus_two", label="stable"), timeout=60)
    predict_request(inputs={})                                         # half_plus_two, no inputs
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import text_format
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, inference_pb2,
                                     model_management_pb2, predict_pb2)


def set_model_spec(spec, name: str, version: int | None = None, label: str | None = None,
                   signature: str = "") -> None:
    """Fill a ModelSpec: the name, the version or the label where given, the signature."""
    spec.name = name
    if version is not None:
        spec.version.value = version
    if label is not None:
        spec.version_label = label
    spec.signature_name = signature


def float_tensor(values: list[float], shape: list[int] | None = None):
    """A DT_FLOAT TensorProto of ``values`` in float_val, of ``shape`` (default [len(values)])."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=values)
    for size in shape if shape is not None else [len(values)]:
        tensor.tensor_shape.dim.add(size=size)
    return tensor


def predict_request(name: str = "half_plus_two", x: float = 2.0, *, version: int | None = None,
                    label: str | None = None, signature: str = "", inputs: dict | None = None,
                    output_filter: Iterable[str] = ()):
    """A PredictRequest for ``name`` with input ``x`` as the float tensor [x].

    ``inputs`` ({alias: TensorProto}) replaces that input, ``{}`` sends none; ``version``,
    ``label`` and ``signature`` go into the model spec.
    """
    request = predict_pb2.PredictRequest()
    set_model_spec(request.model_spec, name, version, label, signature)
    for alias, proto in (inputs if inputs is not None else {"x": float_tensor([x])}).items():
        request.inputs[alias].CopyFrom(proto)
    request.output_filter.extend(output_filter)
    return request


def example_input(target, x: float = 2.0) -> None:
    """Append an Example with feature x = [x] to an Input message (Classify, Regress, MultiInference)."""
    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(x)
    target.example_list.examples.append(example)


def example_request(message, name: str, signature: str, *, label: str | None = None, x: float = 2.0):
    """A ``message()`` (ClassificationRequest, RegressionRequest) for ``name``'s ``signature``,
    of the version ``label`` names where given, with one Example x = [x]."""
    request = message()
    set_model_spec(request.model_spec, name, label=label, signature=signature)
    example_input(request.input, x)
    return request


def regress_and_classify_request(name: str, *, label: str | None = None):
    """A MultiInferenceRequest: regress_x_to_y then classify_x_to_y of ``name`` (by ``label``
    where given) on one Example x = [2.0]."""
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (("regress_x_to_y", "tensorflow/serving/regress"),
                              ("classify_x_to_y", "tensorflow/serving/classify")):
        task = request.tasks.add(method_name=method)
        set_model_spec(task.model_spec, name, label=label, signature=signature)
    example_input(request.input)
    return request


def metadata_request(name: str, *, label: str | None = None):
    """A GetModelMetadataRequest for ``name``'s signature_def (of the version ``label`` names)."""
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    set_model_spec(request.model_spec, name, label=label)
    request.metadata_field.append("signature_def")
    return request


def status_request(name: str, version: int | None = None, label: str | None = None):
    """A GetModelStatusRequest for ``name``, of one version or label where given."""
    request = get_model_status_pb2.GetModelStatusRequest()
    set_model_spec(request.model_spec, name, version, label)
    return request


def reload_request(config_text: str):
    """A ReloadConfigRequest from text-format ModelServerConfig."""
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(config_text, request.config)
    return request
