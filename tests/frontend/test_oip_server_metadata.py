"""ServerMetadata's extensions through tfscache: the node's, less those tfscache does not serve."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import service_pb2

from tfscache import errors
from tfscache.frontend.protocols.oip.server_metadata import served_grpc, served_rest

NODE_EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging",
]
SERVED = ["classification", "sequence", "schedule_policy", "model_configuration",
          "binary_tensor_data", "parameters", "statistics"]


def test_grpc_answer_keeps_name_version_and_served_extensions_in_order():
    node = service_pb2.ServerMetadataResponse(
        name="triton", version="2.51.0", extensions=NODE_EXTENSIONS)
    served = service_pb2.ServerMetadataResponse.FromString(served_grpc(node.SerializeToString()))
    assert (served.name, served.version, list(served.extensions)) == ("triton", "2.51.0", SERVED)


def test_grpc_answer_without_extensions_is_unchanged():
    node = service_pb2.ServerMetadataResponse(name="mlserver", version="1.7.1").SerializeToString()
    assert served_grpc(node) == node


def test_grpc_answer_that_does_not_parse_is_internal():
    with pytest.raises(errors.Internal):
        served_grpc(b"\x1a\x05abc")  # a string field longer than the bytes left


def test_rest_answer_drops_unserved_extensions():
    body = json.dumps({"name": "triton", "version": "2.51.0", "extensions": NODE_EXTENSIONS})
    assert json.loads(served_rest(body.encode())) == {
        "name": "triton", "version": "2.51.0", "extensions": SERVED}


def test_rest_answer_that_is_not_metadata_json_is_kept():
    assert served_rest(b"not json") == b"not json"
    assert served_rest(b'{"error": "x"}') == b'{"error": "x"}'
