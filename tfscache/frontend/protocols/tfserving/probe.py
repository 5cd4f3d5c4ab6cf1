"""TF Serving's words for a status probe answered without loading (tfscache.frontend.probe).

TF Serving loads every configured model at start-up, so a client that polls
``GetModelStatus`` (or ``GET /v1/models/NAME``) until AVAILABLE and then sends requests
works against it. Through tfscache the version a request would load is AVAILABLE, and END
with the load's error while a failed load backs off.
"""

from __future__ import annotations

import json

from tfscache import errors
from tfscache.frontend.probe import ProbeAnswer
from tfscache.frontend.upstream import RestReply
from tfscache.wire import serving_pb2 as pb


def status_response(
    version: int, failure: errors.TfscacheError | None
) -> pb.GetModelStatusResponse:
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


def grpc_status(answer: ProbeAnswer) -> bytes:
    """GetModelStatus's answer for a version a request would load (``Method.probe``)."""
    return status_response(answer.version, answer.failure).SerializeToString()


def rest_status(answer: ProbeAnswer) -> RestReply:
    """``GET /v1/models/NAME[/versions/V]``'s answer for the same."""
    return RestReply(200, status_json(answer.version, answer.failure).encode(), "application/json")
