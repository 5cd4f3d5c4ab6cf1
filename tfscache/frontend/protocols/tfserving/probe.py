"""GetModelStatus answered without loading: a readiness probe never churns the cache.

TF Serving loads every configured model at start-up, so a client that polls
``GetModelStatus`` (or ``GET /v1/models/NAME``) until AVAILABLE and then sends
requests works against it. Through tfscache such a poll must not load the model:
thousands of probes would evict the models in use. So a status request for a model
version that is not in its node's config is answered here, as TF Serving would
answer for a configured model: the version a request would get (the one asked for,
else the highest on disk) is AVAILABLE, since a request for it loads it. While a
failed load of it backs off (``cache.failure_backoff_s``) it is END with that
load's error, which is what a request would get. A version that is loading or
resident is answered by its node, with the node's own state.

The Open Inference Protocol's ModelReady (Triton nodes) is answered by the same rule:
``ready`` is true for a version a request would load, false while its load backs off.
``GRPC_PROBES`` names the gRPC methods answered so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import STATUS_PATH
from tfscache.frontend.protocols.oip.methods import MODEL_READY_PATH, ready_response
from tfscache.frontend.upstream import RestReply
from tfscache.wire import serving_pb2 as pb

GRPC_PROBES = frozenset({STATUS_PATH, MODEL_READY_PATH})


def status_response(version: int, failure: errors.TfscacheError | None) -> pb.GetModelStatusResponse:
    """The GetModelStatusResponse of a version that is on disk but not on its node."""
    response = pb.GetModelStatusResponse()
    entry = response.model_version_status.add(version=version)
    entry.status.SetInParent()
    if failure is None:
        entry.state = pb.ModelVersionStatus.AVAILABLE
    else:
        entry.state = pb.ModelVersionStatus.END
        entry.status.error_code = failure.grpc_code.value[0]
        entry.status.error_message = failure.message
    return response


def status_json(version: int, failure: errors.TfscacheError | None) -> str:
    """The same as TF Serving's REST API prints it: protobuf JSON with every field, enums by name
    (error_code is a tensorflow.error.Code, named as gRPC's codes are), int64 as a string."""
    status = {"error_code": "OK" if failure is None else failure.grpc_code.name,
              "error_message": "" if failure is None else failure.message}
    state = "AVAILABLE" if failure is None else "END"
    body = {"model_version_status": [{"version": str(version), "state": state, "status": status}]}
    return json.dumps(body, indent=1) + "\n"


@dataclass(frozen=True)
class ProbeAnswer:
    """A status answer for ``version``, which a request would load (or get ``failure`` for)."""

    version: int
    failure: errors.TfscacheError | None = None

    def grpc(self, path: str = STATUS_PATH) -> bytes:
        """The answer to the status method ``path`` (one of GRPC_PROBES)."""
        if path == MODEL_READY_PATH:
            return ready_response(self.failure is None)
        return status_response(self.version, self.failure).SerializeToString()

    def rest(self) -> RestReply:
        return RestReply(200, status_json(self.version, self.failure).encode(), "application/json")
