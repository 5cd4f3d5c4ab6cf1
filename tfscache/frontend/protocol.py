"""A protocol: the API a front end speaks, as one value a node kind names (tfscache.kinds.table).

Each package under ``tfscache/frontend/protocols/`` exports one ``PROTOCOL``. The generic
servers take it whole and never default to one: the gRPC front end serves
``grpc_methods`` (``Method`` rows, each with its routing key, status probe and texts) and
refuses ``grpc_refused``, and serves ``grpc_streams`` (streaming methods); the REST front end
answers every URL with ``rest_api``; health
(grpc.health.v1) reports ``health_services``. A kind whose node speaks a protocol with
differences (headers, extensions, texts) names its own variant of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tfscache import errors
from tfscache.dataplane.config import Rules
from tfscache.frontend.methods import Method


@dataclass(frozen=True)
class Protocol:
    """One API of the front ends."""

    name: str  # in logs: "TF Serving", "Open Inference Protocol"
    grpc_methods: Mapping[str, Method]  # path -> method served
    grpc_refused: Mapping[str, errors.TfscacheError]  # path -> the error it is answered with
    # (router, *, max_receive_bytes, timeout_s) -> an object with
    # ``async respond(aiohttp request) -> (response, method name)``
    rest_api: Callable[..., object]
    health_services: tuple[str, ...]  # grpc.health.v1 service names answered ("" is the server)
    # streaming methods: path -> handler factory (router, metrics) -> grpc.RpcMethodHandler
    grpc_streams: Mapping[str, Callable[..., object]] = field(default_factory=dict)
    # how HAProxy reads the model of a hot request (server.data_plane = haproxy)
    data_plane: Rules | None = None
