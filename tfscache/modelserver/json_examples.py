"""TF Serving's JSON -> tf.Example conversion for Classify and Regress requests (util/json_tensor.cc).

``fill_example_request(doc, request)`` fills a ClassificationRequest or
RegressionRequest from a body parsed by ``json_tensor.parse_json``: its signature
name, the optional "context" example and the "examples" list. Every error is a
``TfscacheError`` with TF Serving's text.
"""

from __future__ import annotations

from typing import Any

from tensorflow.core.example import example_pb2, feature_pb2

from tfscache.errors import InvalidArgument
from tfscache.modelserver.json_tensor import signature_name
from tfscache.modelserver.json_values import INT64, UINT64, b64decode, is_b64, utf8_bytes
from tfscache.modelserver.rapidjson_reader import json_type
from tfscache.modelserver.rapidjson_writer import debug_string


def _feature_kind_error(name: str, feature: feature_pb2.Feature) -> InvalidArgument:
    kind = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}.get(
        feature.WhichOneof("kind"), "UNKNOWN")
    return InvalidArgument(f"Unexpected element type in feature: {name} expecting type: {kind}")


def _add_to_feature(value: Any, name: str, feature: feature_pb2.Feature) -> None:
    """AddValueToFeature."""
    kind = feature.WhichOneof("kind")

    def want(wanted: str) -> None:
        if kind not in (None, wanted):
            raise _feature_kind_error(name, feature)

    if value is None or isinstance(value, list) or (isinstance(value, dict) and not is_b64(value)):
        raise InvalidArgument(
            f"Feature: {name} has element with unexpected JSON type: {json_type(value)}")
    if isinstance(value, bool):
        want("int64_list")
        feature.int64_list.value.append(int(value))
    elif isinstance(value, dict):
        want("bytes_list")
        feature.bytes_list.value.append(b64decode(value))
    elif isinstance(value, str):
        want("bytes_list")
        feature.bytes_list.value.append(utf8_bytes(value))
    elif isinstance(value, int) and INT64[0] <= value < UINT64[1]:
        want("int64_list")
        if value >= INT64[1]:
            raise InvalidArgument(
                f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        feature.int64_list.value.append(value)
    else:  # a fraction, an exponent, or an integer too wide for 64 bits: a double
        want("float_list")
        feature.float_list.value.append(float(value))


def _example(value: Any, example: example_pb2.Example) -> None:
    """MakeExampleFromJsonObject."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"Example must be JSON object but got JSON {json_type(value)}")
    for name, content in value.items():
        feature = feature_pb2.Feature()
        for item in content if isinstance(content, list) else (content,):
            _add_to_feature(item, name, feature)
        example.features.feature[name].CopyFrom(feature)


def fill_example_request(doc: dict, request: Any) -> None:
    """FillClassifyRegressRequestFromJson: signature, context, examples -> request.

    ``request`` is a ClassificationRequest or RegressionRequest. TF Serving says
    "When method is classify" for Regress too; so does this.
    """
    request.model_spec.signature_name = signature_name(doc)
    has_context = "context" in doc
    if has_context:
        _example(doc["context"], request.input.example_list_with_context.context)
    if "examples" not in doc:
        raise InvalidArgument(f"JSON Value: {debug_string(doc)} When method is classify, "
                              "key 'examples' is expected and was not found")
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise InvalidArgument(
            f"JSON Value: {debug_string(doc)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise InvalidArgument(f"JSON Value: {debug_string(doc)} 'examples' value is an empty array")
    target = (request.input.example_list_with_context.examples if has_context
              else request.input.example_list.examples)
    for value in examples:
        _example(value, target.add())
