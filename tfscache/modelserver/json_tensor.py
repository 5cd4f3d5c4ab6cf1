"""TF Serving's JSON -> tensor conversion for REST requests (util/json_tensor.cc).

Pure conversion, no transport: the REST adapter (rest_api.py) parses a body with
``parse_json``, reads ``signature_name``, and converts Predict inputs with
``predict_inputs`` (given the signature's input map). Classify/Regress requests are
json_examples.py's, the rules for single values json_values.py's; responses are
rendered by json_response.py.
Every error is a ``TfscacheError`` carrying TF Serving's own text, because clients
match on it.

TF Serving parses with rapidjson; so does this module, through python-rapidjson
(rapidjson_reader.py), so parse errors read "JSON Parse error: Invalid value. at
offset: 0" with rapidjson's own texts and offsets, and what rapidjson accepts ("Inf",
trailing bytes after the root value, 500000 nested arrays) is accepted.
"""

from __future__ import annotations

import enum
from typing import Any, Mapping

from tensorflow.core.framework import tensor_pb2, types_pb2

from tfscache.errors import InvalidArgument, TfscacheError, Unimplemented
from tfscache.modelserver import tensor_limits
from tfscache.modelserver.json_values import (
    CONVERSIONS,
    b64decode,
    dtype_string,
    is_b64,
    utf8_bytes,
)
from tfscache.modelserver.rapidjson_reader import ParseError, json_type, parse
from tfscache.modelserver.rapidjson_writer import debug_string


class JsonFormat(enum.Enum):
    """How a Predict request was written; the response uses the same format."""

    ROW = "instances"
    COLUMNAR = "inputs"


# ---------------------------------------------------------------------------
# Parsing


def parse_json(body: bytes | str) -> dict:
    """ParseJson: the request body as a JSON object, or TF Serving's error."""
    data = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else bytes(body)
    if not data:
        raise InvalidArgument("JSON Parse error: The document is empty")
    try:
        doc = parse(data)
    except ParseError as exc:
        raise InvalidArgument(
            f"JSON Parse error: {exc.message} at offset: {exc.offset}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"JSON Value: {debug_string(doc)} Is not object")
    return doc


def signature_name(doc: dict) -> str:
    """FillSignature: the optional "signature_name" ('' when absent)."""
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise InvalidArgument(
            f"JSON Value: {debug_string(doc)} not formatted correctly. "
            "'signature_name' key must be a string value.")
    return name


# ---------------------------------------------------------------------------
# Predict requests


def _status_string(error: TfscacheError) -> str:
    """absl::Status::ToString(): 'INVALID_ARGUMENT: message'."""
    return f"{error.grpc_code.name}: {error.message}"


def _type_error(value: Any, dtype: int) -> InvalidArgument:
    return InvalidArgument(f"JSON Value: {debug_string(value)} Type: {json_type(value)} "
                           f"is not of expected type: {dtype_string(dtype)}")


# dtype -> accepts(value) for values that go into the tensor unchanged.
_BULK = {dtype: accepts for dtype, (_, accepts) in CONVERSIONS.items()
         if dtype != types_pb2.DT_STRING}


def _leaf(value: Any, dtype: int) -> Any:
    """AddValueToTensor (or the base64 object of a DT_STRING)."""
    if isinstance(value, dict):
        if dtype == types_pb2.DT_STRING:
            return b64decode(value)
        raise _type_error(value, dtype)
    conversion = CONVERSIONS.get(dtype)
    if conversion is None:
        raise Unimplemented(f"Conversion of JSON Value: {debug_string(value)} "
                            f"to type: {dtype_string(dtype)}")
    if not conversion[1](value):
        raise _type_error(value, dtype)
    if dtype == types_pb2.DT_STRING:
        return utf8_bytes(value)
    return value


def _dense_shape(value: Any) -> list[int]:
    """GetDenseTensorShape: sizes along the first element of each level."""
    dims = []
    while isinstance(value, list):
        dims.append(len(value))
        if not value:
            break
        value = value[0]
    return dims


def _flatten(value: Any, dims: list[int], dtype: int, out: list) -> int:
    """FillTensorProto, depth first as TF Serving, without recursion.

    An innermost list whose values all convert as they are goes in whole (the
    fast path); any other is walked value by value, for TF Serving's errors.
    """
    rank, count = len(dims), 0
    accepts = _BULK.get(dtype)
    stack: list[tuple[Any, int]] = [(iter((value,)), -1)]
    while stack:
        items, parent_level = stack[-1]
        item = next(items, stack)
        if item is stack:
            stack.pop()
            continue
        level = parent_level + 1
        if isinstance(item, list):
            if level >= rank:
                raise InvalidArgument(
                    f"Encountered list at unexpected level: {level} expected < {rank}")
            if len(item) != dims[level]:
                raise InvalidArgument(
                    f"Encountered list at unexpected size: {len(item)} at level: {level} "
                    f"expected size: {dims[level]}")
            if level == rank - 1 and accepts is not None and all(map(accepts, item)):
                out.extend(item)
                count += len(item)
                continue
            stack.append((iter(item), level))
            continue
        if level != rank:
            raise InvalidArgument(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level + 1} "
                f"in the JSON DOM. Expected at level: {rank}")
        out.append(_leaf(item, dtype))
        count += 1
    return count


def _tensor(dtype: int, dims: list[int], values: list) -> tensor_pb2.TensorProto:
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    tensor.tensor_shape.SetInParent()  # a scalar still has a (rank 0) shape
    for size in dims:
        tensor.tensor_shape.dim.add(size=size)
    if values:
        getattr(tensor, CONVERSIONS[dtype][0]).extend(values)
    return tensor


def _shape_string(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class _Batch:
    """The per-input accumulation of AddInstanceItem."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {}
        self.shapes: dict[str, list[int]] = {}
        self.sizes: dict[str, int] = {}

    def add(self, item: Any, name: str, inputs: Mapping[str, Any]) -> None:
        if name not in inputs:
            raise InvalidArgument(f"JSON object: does not have named input: {name}")
        dims = _dense_shape(item)
        size = _flatten(item, dims, inputs[name].dtype, self.values.setdefault(name, []))
        if name not in self.sizes:
            self.sizes[name], self.shapes[name] = size, dims
        elif self.sizes[name] != size:
            raise InvalidArgument(f"Expecting tensor size: {self.sizes[name]} but got: {size}")
        elif self.shapes[name] != dims:
            raise InvalidArgument(f"Expecting shape {_shape_string(self.shapes[name])} "
                                  f"but got: {_shape_string(dims)}")


def _is_element_object(value: Any) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def _row_inputs(instances: list, inputs: Mapping[str, Any]) -> dict[str, tensor_pb2.TensorProto]:
    """FillTensorMapFromInstancesList."""
    if not isinstance(instances[0], dict) and len(inputs) > 1:
        raise InvalidArgument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map")
    as_objects = _is_element_object(instances[0])
    names = sorted(inputs)
    batch = _Batch()
    for index, element in enumerate(instances):
        if as_objects:
            if not _is_element_object(element):
                raise InvalidArgument(
                    f"Expecting object but got list at item {index} of input list")
            for name, item in element.items():
                try:
                    batch.add(item, name, inputs)
                except TfscacheError as exc:
                    raise InvalidArgument(
                        f"Failed to process element: {index} key: {name} of 'instances' "
                        f"list. Error: {_status_string(exc)}") from None
            if sorted(element) != names:
                raise InvalidArgument(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{debug_string(element)} keys must be equal to: {','.join(names)}")
        else:
            if _is_element_object(element):
                raise InvalidArgument(
                    f"Expecting value/list but got object at item {index} of input list")
            try:
                batch.add(element, names[0], inputs)
            except TfscacheError as exc:
                raise InvalidArgument(
                    f"Failed to process element: {index} of 'instances' list. "
                    f"Error: {_status_string(exc)}") from None
    return {name: _tensor(inputs[name].dtype, [len(instances)] + batch.shapes[name], values)
            for name, values in batch.values.items()}


def _one_tensor(value: Any, dtype: int) -> tensor_pb2.TensorProto:
    dims = _dense_shape(value)
    values: list = []
    _flatten(value, dims, dtype, values)
    return _tensor(dtype, dims, values)


def _columnar_inputs(value: Any, inputs: Mapping[str, Any]) -> dict[str, tensor_pb2.TensorProto]:
    """FillTensorMapFromInputsMap."""
    if not isinstance(value, dict) or is_b64(value):
        if len(inputs) > 1:
            raise InvalidArgument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map")
        name = next(iter(inputs))
        return {name: _one_tensor(value, inputs[name].dtype)}
    tensors = {}
    for name in sorted(inputs):
        if name not in value:
            raise InvalidArgument(f"Missing named input: {name} in 'inputs' object.")
        tensors[name] = _one_tensor(value[name], inputs[name].dtype)
    return tensors


def _check_claimed_shapes(value: Any, inputs: Mapping[str, Any], fmt: JsonFormat,
                          max_bytes: int | None) -> None:
    """tensor_limits' checks on the shapes the JSON claims (its first elements), before
    any value is converted: too many dimensions, and the decoded-size bound."""
    total = 0
    for name in sorted(inputs):
        if fmt is JsonFormat.ROW:
            first = value[0]
            item = first.get(name) if _is_element_object(first) else first
            dims = [len(value)] + _dense_shape(item)
        else:
            item = value.get(name) if isinstance(value, dict) and not is_b64(value) else value
            dims = _dense_shape(item)
        tensor_limits.check_shape(name, dims)
        total += tensor_limits.decoded_bytes(inputs[name].dtype, dims)
    tensor_limits.check_total(total, max_bytes)


def predict_inputs(doc: dict, inputs: Mapping[str, Any], signature: str = "",
                   max_bytes: int | None = None,
                   ) -> tuple[dict[str, tensor_pb2.TensorProto], JsonFormat]:
    """FillPredictRequestFromJson after the signature lookup.

    ``inputs`` is the signature's input map (alias -> TensorInfo, anything with a
    ``dtype``); ``signature`` is the requested name, for the empty-map message;
    ``max_bytes`` bounds the tensors' decoded size (tensor_limits).
    """
    if not inputs:
        raise InvalidArgument(
            f"Failed to get input map for signature: {signature or 'DEFAULT'}")
    if "instances" in doc:
        if "inputs" in doc:
            raise InvalidArgument(
                f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only "
                "one of 'inputs' or 'instances' keys to exist ")
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise InvalidArgument(
                f"JSON Value: {debug_string(doc)} Expecting 'instances' to be an list/array")
        if not instances:
            raise InvalidArgument(f"JSON Value: {debug_string(doc)} No values in 'instances' array")
        _check_claimed_shapes(instances, inputs, JsonFormat.ROW, max_bytes)
        return _row_inputs(instances, inputs), JsonFormat.ROW
    if "inputs" in doc:
        _check_claimed_shapes(doc["inputs"], inputs, JsonFormat.COLUMNAR, max_bytes)
        return _columnar_inputs(doc["inputs"], inputs), JsonFormat.COLUMNAR
    raise InvalidArgument("Missing 'inputs' or 'instances' key")
