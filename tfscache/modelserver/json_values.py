"""TF Serving's rules for single JSON values against tensor dtypes (util/json_tensor.cc).

Shared by the request side (json_tensor.py for Predict, json_examples.py for
Classify and Regress) and the response side (json_response.py):

* ``CONVERSIONS``: dtype -> (TensorProto value field, accepts(value)); a dtype not in
  it cannot be converted either way (TF Serving's "Conversion of JSON Value" and
  "Failed to write JSON value" errors).
* ``dtype_string``: tensorflow::DataTypeString, as the error texts print a dtype.
* ``is_b64`` / ``b64decode``: the ``{"b64": "..."}`` object of binary strings.
* ``utf8_bytes``: a parsed string's bytes, as sent.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable

from tensorflow.core.framework import types_pb2

from tfscache.errors import InvalidArgument
from tfscache.modelserver.rapidjson_writer import debug_string

INT32 = (-(2**31), 2**31)
INT64 = (-(2**63), 2**63)
UINT32 = (0, 2**32)
UINT64 = (0, 2**64)
TOO_BIG_INT = 2**1024  # integers from here on do not fit a double


def dtype_string(dtype: int) -> str:
    """tensorflow::DataTypeString: DT_FLOAT -> 'float'."""
    try:
        return types_pb2.DataType.Name(dtype)[3:].lower()
    except ValueError:
        return f"unknown dtype enum ({dtype})"


def _is_integer(value: Any, bounds: tuple[int, int]) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and bounds[0] <= value < bounds[1])


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is float or (kind is int and -TOO_BIG_INT < value < TOO_BIG_INT)


_SMALL_INTS = (types_pb2.DT_INT32, types_pb2.DT_INT16, types_pb2.DT_INT8, types_pb2.DT_UINT8)
CONVERSIONS: dict[int, tuple[str, Callable[[Any], bool]]] = {
    types_pb2.DT_FLOAT: ("float_val", _is_number),
    types_pb2.DT_DOUBLE: ("double_val", _is_number),
    **{dt: ("int_val", lambda v: _is_integer(v, INT32)) for dt in _SMALL_INTS},
    types_pb2.DT_STRING: ("string_val", lambda v: isinstance(v, str)),
    types_pb2.DT_INT64: ("int64_val", lambda v: _is_integer(v, INT64)),
    types_pb2.DT_BOOL: ("bool_val", lambda v: isinstance(v, bool)),
    types_pb2.DT_UINT32: ("uint32_val", lambda v: _is_integer(v, UINT32)),
    types_pb2.DT_UINT64: ("uint64_val", lambda v: _is_integer(v, UINT64)),
}


def is_b64(value: Any) -> bool:
    """A ``{"b64": "..."}`` object (and nothing else in it)."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def b64decode(value: Any) -> bytes:
    """The bytes of a ``{"b64": ...}`` object (padding optional), or TF Serving's error."""
    if not is_b64(value):
        raise InvalidArgument(
            f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
    text = value["b64"]
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("Unable to base64 decode") from None


def utf8_bytes(text: str) -> bytes:
    """The bytes of a parsed string: invalid UTF-8 kept as sent, lone surrogates passed."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
