"""Bounds on request tensors, checked from their shapes before anything is allocated.

A TensorProto names its shape and may carry no values at all (TF fills it with zeros),
so a 28-byte request can ask for gigabytes. Before a request's tensors are decoded,
``check_inputs`` (gRPC) and ``check_shape`` / ``check_total`` (REST JSON) look at
the shapes only:

* more than 254 dimensions: TensorShape's limit; "Shape [...] has too many dimensions"
  as TensorShape::IsValidShape says it;
* 65 to 254 dimensions: TensorFlow allows them, numpy (which holds a request's
  tensors here) does not: INVALID_ARGUMENT naming that limit;
* more than 2**63 - 1 elements (also with a zero dimension, as
  TensorShape::BuildTensorShapeBase checks): IsValidShape's "is too large" text;
* decoded size over the node's ``--max_request_tensor_bytes`` (all of a request's
  tensors together): RESOURCE_EXHAUSTED naming the bound and the flag;
* decoded size over the machine's memory, whatever the bound: the allocation TF
  would attempt fails, which TF Serving reports as a parse error.

Shape errors carry TF Serving's "tensor parsing error: <alias>" (what
Tensor::FromProto's failure gives) followed by the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from tensorflow.core.framework import types_pb2

from tfscache.errors import InvalidArgument, ResourceExhausted

MAX_TF_DIMS = 254     # TensorShape::MaxDimensions()
MAX_NUMPY_DIMS = 64   # numpy 2's NPY_MAXDIMS
INT64_MAX = 2**63 - 1
DEFAULT_MAX_REQUEST_TENSOR_BYTES = 2**30
FLAG = "--max_request_tensor_bytes"
_SHOWN_DIMS = 8  # a shape in a message shows its first dimensions only

# Bytes per element once decoded: DataTypeSize, and sizeof(tstring) for strings.
_ITEM_BYTES = {
    types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4,
    types_pb2.DT_UINT8: 1, types_pb2.DT_INT16: 2, types_pb2.DT_INT8: 1,
    types_pb2.DT_STRING: 24, types_pb2.DT_COMPLEX64: 8, types_pb2.DT_INT64: 8,
    types_pb2.DT_BOOL: 1, types_pb2.DT_QINT8: 1, types_pb2.DT_QUINT8: 1,
    types_pb2.DT_QINT32: 4, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_QINT16: 2,
    types_pb2.DT_QUINT16: 2, types_pb2.DT_UINT16: 2, types_pb2.DT_COMPLEX128: 16,
    types_pb2.DT_HALF: 2, types_pb2.DT_UINT32: 4, types_pb2.DT_UINT64: 8,
}


def shape_debug_string(dims: list[int]) -> str:
    """TensorShape's DebugString, cut after a few dimensions: [1,1,...] (300 dims)."""
    if len(dims) <= _SHOWN_DIMS:
        return "[" + ",".join(map(str, dims)) + "]"
    shown = ",".join(map(str, dims[:_SHOWN_DIMS]))
    return f"[{shown},...] ({len(dims)} dimensions)"


def shape_problem(dims: list[int]) -> str | None:
    """Why a tensor of this shape cannot be built here, or None."""
    if len(dims) > MAX_TF_DIMS:
        return f"Shape {shape_debug_string(dims)} has too many dimensions"
    if len(dims) > MAX_NUMPY_DIMS:
        return (f"Shape {shape_debug_string(dims)} has {len(dims)} dimensions; tfscache node "
                f"supports at most {MAX_NUMPY_DIMS} (TensorFlow allows {MAX_TF_DIMS})")
    count = 1
    for size in dims:
        if size < 0:
            return f"Shape {shape_debug_string(dims)} is not fully defined"
        if size:
            count *= size
            if count > INT64_MAX:
                return (
                    f"Shape {shape_debug_string(dims)} is too large (more than 2**63 - 1 entries)"
                )
    return None


def element_count(dims: Iterable[int]) -> int:
    count = 1
    for size in dims:
        count *= size
    return count


def decoded_bytes(dtype: int, dims: list[int]) -> int:
    """Bytes the decoded tensor takes (8 per element for a dtype of unknown size)."""
    return element_count(dims) * _ITEM_BYTES.get(dtype, 8)


def check_shape(alias: str, dims: list[int]) -> None:
    problem = shape_problem(dims)
    if problem is not None:
        raise InvalidArgument(f"tensor parsing error: {alias}: {problem}")


def check_total(total: int, limit: int | None) -> None:
    """RESOURCE_EXHAUSTED when ``total`` decoded bytes exceed ``limit`` (None or 0: no bound)."""
    if limit and total > limit:
        raise ResourceExhausted(
            f"Request tensors would take {total} bytes once decoded, more than this node's "
            f"bound of {limit} bytes (set by {FLAG})")


def check_memory(alias: str, size: int) -> None:
    """What TF's failed allocation gives: a parse error, before anything is allocated."""
    memory = physical_memory()
    if memory and size > memory:
        raise InvalidArgument(
            f"tensor parsing error: {alias}: the tensor would take {size} bytes once "
            f"decoded, more than this machine's memory ({memory} bytes)")


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def check_inputs(inputs: Mapping[str, object], limit: int | None) -> None:
    """A Predict request's input TensorProtos, checked from their shapes alone."""
    total = 0
    for alias in sorted(inputs):
        proto = inputs[alias]
        if proto.tensor_shape.unknown_rank:
            continue  # Tensor::FromProto refuses it; the parse reports that
        dims = [d.size for d in proto.tensor_shape.dim]
        check_shape(alias, dims)
        size = decoded_bytes(proto.dtype, dims)
        check_memory(alias, size)
        total += size
    check_total(total, limit)
