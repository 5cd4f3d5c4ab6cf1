"""The one error tree of tfscache.

Every error a client can see is a ``TfscacheError``. Each class states its gRPC
status code and its HTTP status separately; neither is derived from the other.
TF Serving's own mapping (http_server.cc) is followed where it has one, so a
client gets the same code from tfscache as from a TF Serving node.

    TfscacheError                    UNKNOWN             500
    ├── InvalidArgument              INVALID_ARGUMENT    400
    │   └── UnsafeModelName          INVALID_ARGUMENT    400
    ├── FailedPrecondition           FAILED_PRECONDITION 400
    ├── OutOfRange                   OUT_OF_RANGE        400
    ├── NotFound                     NOT_FOUND           404
    │   └── ModelNotFound            NOT_FOUND           404
    │       └── VersionNotFound      NOT_FOUND           404
    ├── AlreadyExists                ALREADY_EXISTS      409
    ├── Aborted                      ABORTED             409
    ├── PermissionDenied             PERMISSION_DENIED   403
    ├── Unauthenticated              UNAUTHENTICATED     401
    ├── ResourceExhausted            RESOURCE_EXHAUSTED  429
    │   └── CapacityExhausted        RESOURCE_EXHAUSTED  429
    ├── Cancelled                    CANCELLED           499
    ├── DeadlineExceeded             DEADLINE_EXCEEDED   504
    ├── Unimplemented                UNIMPLEMENTED       501
    ├── Unavailable                  UNAVAILABLE         503
    │   └── NodeUnavailable          UNAVAILABLE         503
    ├── Internal                     INTERNAL            500
    ├── DataLoss                     DATA_LOSS           500
    └── Unknown                      UNKNOWN             500

Errors from a node are translated where the node is called, with
``raise error_for_code(code, message) from exc``; TF Serving's message is kept
word for word because clients match on it.
"""

from __future__ import annotations

import re

import grpc

# What model servers say when a device or host runs out of memory, in their own words: CUDA's
# runtime and driver, PyTorch (Triton's PyTorch and Python backends), ONNX Runtime's arena,
# TensorFlow's ResourceExhausted ("OOM when allocating tensor"), Python's MemoryError (MLServer
# and Triton's Python backend pass it on), and Triton's Python backend short of shared memory.
_OUT_OF_MEMORY = re.compile(
    r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError"
    r"|OOM when allocating|Failed to allocate memory|MemoryError"
    r"|Failed to increase the shared memory pool size",
    re.IGNORECASE,
)


def is_out_of_memory(text: str) -> bool:
    """Whether a node's error text says it ran out of memory (module constant's sources)."""
    return _OUT_OF_MEMORY.search(text) is not None


class TfscacheError(Exception):
    """Base class: a client-visible error with a gRPC code and an HTTP status."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    http_status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidArgument(TfscacheError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class UnsafeModelName(InvalidArgument):
    """A model name that is not one safe path segment."""


class FailedPrecondition(TfscacheError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 400


class OutOfRange(TfscacheError):
    grpc_code = grpc.StatusCode.OUT_OF_RANGE
    http_status = 400


class NotFound(TfscacheError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class ModelNotFound(NotFound):
    """No such model (or version) in the model repository.

    ``name`` and ``version`` (None: the latest was asked for) are the facts when the generic
    repository raised it (``neutral``: its message is tfscache's own words); each node kind words
    a neutral one as its server would (``NodeAdapter.missing``), and each protocol's methods may
    word it again for their clients."""

    def __init__(self, message: str, *, name: str | None = None, version: int | None = None,
                 neutral: bool = False) -> None:
        super().__init__(message)
        self.name, self.version, self.neutral = name, version, neutral


class VersionNotFound(ModelNotFound):
    """The model is in the repository, but not the version asked for (same text as ModelNotFound's;
    a node kind that words the two cases apart, Triton, tells them by the class)."""


class AlreadyExists(TfscacheError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class Aborted(TfscacheError):
    grpc_code = grpc.StatusCode.ABORTED
    http_status = 409


class PermissionDenied(TfscacheError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class Unauthenticated(TfscacheError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class ResourceExhausted(TfscacheError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429


class CapacityExhausted(ResourceExhausted):
    """A node's model-count or memory cap leaves no room for a load."""


class Cancelled(TfscacheError):
    grpc_code = grpc.StatusCode.CANCELLED
    http_status = 499


class DeadlineExceeded(TfscacheError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


class Unimplemented(TfscacheError):
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    http_status = 501


class Unavailable(TfscacheError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


class NodeUnavailable(Unavailable):
    """A TF Serving node cannot be reached or is marked unhealthy."""


class Internal(TfscacheError):
    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500


class DataLoss(TfscacheError):
    grpc_code = grpc.StatusCode.DATA_LOSS
    http_status = 500


class Unknown(TfscacheError):
    grpc_code = grpc.StatusCode.UNKNOWN
    http_status = 500


_BY_CODE: dict[grpc.StatusCode, type[TfscacheError]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgument, FailedPrecondition, OutOfRange, NotFound, AlreadyExists,
        Aborted, PermissionDenied, Unauthenticated, ResourceExhausted, Cancelled,
        DeadlineExceeded, Unimplemented, Unavailable, Internal, DataLoss, Unknown,
    )
}

# tensorflow.error.Code numbers equal gRPC's numeric codes.
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def error_for_code(code: grpc.StatusCode | int, message: str) -> TfscacheError:
    """The error class for a gRPC code (or its number, as in StatusProto.error_code)."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, Unknown)(message)


def code_name(code: grpc.StatusCode | int) -> str:
    """TF Serving's spelling of a code in messages and REST status JSON, e.g. 'NOT_FOUND'."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    return code.name


SHOWN_CHARS = 200  # how much of a client's string (a model name) an error message echoes


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as an error message may echo it: the first ``limit`` characters, then "..."."""
    return text if len(text) <= limit else text[:limit] + "..."
