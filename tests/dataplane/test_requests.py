"""How a routed request's HAProxy log line becomes the front end's method and code (pure)."""

from __future__ import annotations

import pytest

from tfscache.dataplane.config import LOG_FORMAT, LOG_MARK
from tfscache.dataplane.requests import Routed, parse

TFS_REST = {"predict": "Predict", "classify": "Classify", "regress": "Regress"}


def line(protocol="grpc", server="node0", status="200", ms="3", model="m", grpc_status="-",
         path="/tensorflow.serving.PredictionService/Predict") -> str:
    return (f"{LOG_MARK} 1764900000.042 {protocol} {server} {status} {ms} {model} node0 "
            f"{grpc_status} {path}\n")


def test_the_format_has_the_fields_the_parser_reads():
    assert LOG_FORMAT.split(" ")[0] == LOG_MARK and len(LOG_FORMAT.split(" ")) == 10


@pytest.mark.parametrize("given, method, code", [
    (line(), "Predict", "OK"),  # a reply with a message: its status is in the trailers
    (line(grpc_status="3"), "Predict", "INVALID_ARGUMENT"),  # trailers-only
    (line(grpc_status="14", path="/inference.GRPCInferenceService/ModelInfer"), "ModelInfer",
     "UNAVAILABLE"),
    (line(status="503"), "Predict", "UNAVAILABLE"),  # no gRPC reply at all
    (line(status="418"), "Predict", "UNKNOWN"),
    (line("rest", path="/v1/models/m:classify"), "Classify", "200"),
    (line("rest", status="400", path="/v1/models/m:predict"), "Predict", "400"),
])
def test_a_routed_request_is_named_as_the_front_end_names_it(given, method, code):
    assert parse(given, TFS_REST) == Routed(1764900000.042, given.split()[2], method, code,
                                            0.003, "m", "node0")


@pytest.mark.parametrize("given", [
    line(server="python"),  # the front end answered it as the backup, and counted it
    "Server grpc_node0/node0 is DOWN, reason: Layer4 connection problem\n",
    line(ms="x"),
    f"{LOG_MARK} too few fields\n",
])
def test_other_lines_are_no_routed_request(given):
    assert parse(given, TFS_REST) is None
