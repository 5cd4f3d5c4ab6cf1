"""The Open Inference Protocol (KServe v2): gRPC methods, /v2 REST URLs, the readiness probe."""

from __future__ import annotations

from tfscache.frontend.protocol import Protocol
from tfscache.frontend.protocols.oip.methods import DATA_PLANE, METHODS, REFUSED, SERVICE
from tfscache.frontend.protocols.oip.rest import OipRestApi
from tfscache.frontend.protocols.oip.stream import STREAMS

PROTOCOL = Protocol(
    "Open Inference Protocol", METHODS, REFUSED, OipRestApi, ("", SERVICE), grpc_streams=STREAMS,
    data_plane=DATA_PLANE,
)
