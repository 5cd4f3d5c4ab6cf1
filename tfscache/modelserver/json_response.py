"""TF Serving's REST response bodies: tensors and results -> JSON (util/json_tensor.cc).

Pure conversion, no transport: the REST adapter (rest_api.py) renders a Predict
response with ``predict_json`` (in the ``JsonFormat`` the request was written in),
Classify and Regress results with ``classification_json`` and ``regression_json``,
an error with ``error_json``, and the model status and metadata with
``status_json`` and ``metadata_json``. Requests are json_tensor.py's.
Every error is a ``TfscacheError`` carrying TF Serving's own text, because clients
match on it.

TF Serving writes with rapidjson's PrettyWriter. ``PrettyWriter`` (rapidjson_writer.py)
reproduces its layout byte for byte, including TF Serving's odd
``"predictions": [3.0, 3.5, 4.0\\n    ]``; ``_decimal`` writes floats as TF Serving
does (%g, or full precision where %g does not round-trip). Status and metadata are
protobuf JSON, as in TF Serving.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Mapping

import numpy as np
from google.protobuf import json_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.python.framework import tensor_util
from tensorflow_serving.apis import get_model_metadata_pb2

from tfscache.errors import Internal, InvalidArgument
from tfscache.modelserver.json_tensor import JsonFormat
from tfscache.modelserver.json_values import CONVERSIONS, dtype_string
from tfscache.modelserver.rapidjson_writer import PrettyWriter, quote


def _decimal(value: float, double: bool) -> str:
    """WriteDecimal: %g, else full precision when that does not round-trip; '.0' appended."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = "%g" % value
    if (float(text) if double else np.float32(text)) != value:
        text = ("%.17g" if double else "%.9g") % value
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _float_tokens(array: np.ndarray, double: bool) -> list[str]:
    """_decimal over a whole array: the same texts, with the checks done in bulk."""
    values = array.astype(np.float64).tolist()
    text = ["%g" % v for v in values]
    parsed = np.array([float(t) for t in text])
    finite = np.isfinite(array)
    with np.errstate(all="ignore"):
        lossy = finite & ((parsed if double else parsed.astype(np.float32)) != array)
    wide = "%.17g" if double else "%.9g"
    for i in np.flatnonzero(lossy).tolist():
        text[i] = wide % values[i]
    text = [t if "." in t or "e" in t else t + ".0" for t in text]
    for i in np.flatnonzero(~finite).tolist():
        text[i] = _decimal(values[i], double)
    return text


def _tokens(tensor: tensor_pb2.TensorProto, name: str) -> list[str] | list[bytes]:
    """Every value of a tensor, flat, as its JSON text (AddSingleValueAndAdvance).

    A ``*_bytes`` string tensor gives its raw values: each is written as an object.
    """
    dtype = tensor.dtype
    if dtype not in CONVERSIONS:
        raise InvalidArgument(f"Failed to write JSON value for tensor type: {dtype_string(dtype)}")
    array = tensor_util.MakeNdarray(tensor).reshape(-1)
    if dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        return _float_tokens(array, dtype == types_pb2.DT_DOUBLE)
    if dtype == types_pb2.DT_BOOL:
        return ["true" if v else "false" for v in array.tolist()]
    if dtype == types_pb2.DT_STRING:
        if name.endswith("_bytes"):
            return [bytes(v) for v in array.tolist()]
        return [quote(bytes(v).decode("utf-8", "surrogateescape")) for v in array.tolist()]
    return [str(v) for v in array.tolist()]


def _write_tensor(writer: PrettyWriter, name: str, tensor: tensor_pb2.TensorProto,
                  tokens: list, first_dim: int) -> None:
    """AddTensorValues over dims[first_dim:], consuming ``tokens`` in order."""
    dims = [d.size for d in tensor.tensor_shape.dim][first_dim:]
    as_bytes = tensor.dtype == types_pb2.DT_STRING and name.endswith("_bytes")
    position = iter(tokens)

    def single() -> None:
        value = next(position)
        if as_bytes:
            writer.start_object()
            writer.key("b64")
            writer.string(base64.b64encode(value).decode("ascii"))
            writer.end_object()
        else:
            writer.raw(value)

    def nested(level: int) -> None:
        if level >= len(dims):
            single()
        elif level == len(dims) - 1 and not as_bytes:
            writer.scalars([next(position) for _ in range(dims[level])])
        else:
            writer.start_array()
            for _ in range(dims[level]):
                nested(level + 1)
            writer.end_array()

    nested(0)


def predict_json(outputs: Mapping[str, tensor_pb2.TensorProto], fmt: JsonFormat) -> str:
    """MakeJsonFromTensors: {"predictions": ...} (row) or {"outputs": ...} (columnar)."""
    if not outputs:
        raise InvalidArgument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    writer = PrettyWriter()
    writer.start_object()
    if fmt is JsonFormat.COLUMNAR:
        writer.key("outputs")
        if len(names) > 1:
            writer.start_object()
        for name in names:
            if len(names) > 1:
                writer.key(name)
            _write_tensor(writer, name, outputs[name], _tokens(outputs[name], name), 0)
        if len(names) > 1:
            writer.end_object()
    else:
        _write_rows(writer, outputs, names)
    writer.end_object()
    return writer.text()


def _write_rows(writer: PrettyWriter, outputs: Mapping[str, tensor_pb2.TensorProto],
                names: list[str]) -> None:
    """MakeRowFormatJsonFromTensors."""
    batch = -1
    for name in names:
        dims = outputs[name].tensor_shape.dim
        if not dims:
            raise InvalidArgument(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and dims[0].size != batch:
            raise InvalidArgument(f"Tensor name: {name} has inconsistent batch size: "
                                  f"{dims[0].size} expecting: {batch}")
        batch = dims[0].size
    flat = {name: _tokens(outputs[name], name) for name in names}
    row_size = {name: len(flat[name]) // batch if batch else 0 for name in names}
    writer.key("predictions")
    writer.start_array()
    for row in range(batch):
        if len(names) > 1:
            writer.start_object()
        writer.single_line_arrays = True
        for name in names:
            if len(names) > 1:
                writer.key(name)
            size = row_size[name]
            _write_tensor(writer, name, outputs[name], flat[name][row * size:(row + 1) * size], 1)
        writer.single_line_arrays = False
        if len(names) > 1:
            writer.end_object()
    writer.end_array()


def classification_json(result: Any) -> str:
    """MakeJsonFromClassificationResult: {"results": [[["label", score], ...], ...]}."""
    if not result.classifications:
        raise InvalidArgument("Cannot convert empty ClassificationResults to JSON")
    writer = PrettyWriter()
    writer.start_object()
    writer.key("results")
    writer.start_array()
    for classifications in result.classifications:
        writer.single_line_arrays = True
        writer.start_array()
        for cls in classifications.classes:
            writer.start_array()
            writer.string(cls.label)
            writer.raw(_decimal(cls.score, double=False))
            writer.end_array()
        writer.end_array()
        writer.single_line_arrays = False
    writer.end_array()
    writer.end_object()
    return writer.text()


def regression_json(result: Any) -> str:
    """MakeJsonFromRegressionResult: {"results": [v1, v2, ...]}."""
    if not result.regressions:
        raise InvalidArgument("Cannot convert empty RegressionResults to JSON")
    writer = PrettyWriter()
    writer.start_object()
    writer.key("results")
    writer.single_line_arrays = True
    writer.start_array()
    for regression in result.regressions:
        writer.raw(_decimal(regression.value, double=False))
    writer.end_array()
    writer.end_object()
    return writer.text()


def error_json(message: str) -> str:
    """MakeJsonFromStatus: {"error": "<message>"} without the code."""
    writer = PrettyWriter()
    writer.start_object()
    writer.key("error")
    writer.string(message)
    writer.end_object()
    return writer.text()


def status_json(response: Any) -> str:
    """GetModelStatusResponse as protobuf JSON (json_names, enums by name, int64 as string)."""
    response = type(response).FromString(response.SerializeToString())
    for entry in response.model_version_status:
        entry.status.SetInParent()  # the C++ server always fills it
    return json_format.MessageToJson(
        response, always_print_fields_with_no_presence=True, indent=1) + "\n"


def metadata_json(response: Any) -> str:
    """ToJsonString(GetModelMetadataResponse): TF Serving's hand concatenation."""
    options = dict(always_print_fields_with_no_presence=True,
                   preserving_proto_field_name=True, indent=1)
    model_spec = json_format.MessageToJson(response.model_spec, **options)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    if "signature_def" not in response.metadata:
        raise Internal("Failed to find 'signature_def' key in the GetModelMetadataResponse "
                            "metadata map.")
    if not response.metadata["signature_def"].Unpack(signatures):
        raise Internal("Failed to unpack 'Any' object to 'SignatureDefMap'.")
    signature_json = json_format.MessageToJson(signatures, **options)
    return (f'{{\n"model_spec":{model_spec},\n"metadata": {{"signature_def": '
            f"{signature_json}}}\n}}\n")
