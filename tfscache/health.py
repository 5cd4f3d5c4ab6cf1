"""grpc.health.v1 Health on the front end's gRPC port.

SERVING while the process is not draining and ``serving()`` says so (serve.py passes
``Topology.serving``: its ring has a node, and its node (sidecar) or at least one of
its nodes (embedded) is healthy); NOT_SERVING otherwise. Load
balancers and Kubernetes readiness probes ask service ``""``; clients may ask for
``tensorflow.serving.PredictionService`` or ``tensorflow.serving.ModelService``, which
share that status. Another name gets NOT_FOUND from Check and SERVICE_UNKNOWN from
Watch, as from gRPC's own servicer.

The messages are tfscache.wire.health_pb2 (grpc.health.v1's, field for field), served as
generic handlers, so nothing beyond grpcio is needed. ``set_draining()`` is the
graceful-shutdown phase of gRPC's servicer: every service turns NOT_SERVING for good,
and Watch streams see it at once; other changes (a node going down) reach Watch
streams within ``poll_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from tfscache.frontend.methods import MODEL_SERVICE, PREDICTION_SERVICE
from tfscache.wire import health_pb2

log = logging.getLogger("tfscache.health")

SERVICE = "grpc.health.v1.Health"
CHECK_PATH = f"/{SERVICE}/Check"
WATCH_PATH = f"/{SERVICE}/Watch"
SERVICES = ("", PREDICTION_SERVICE, MODEL_SERVICE)

Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Health:
    """Health status of one process, and the gRPC handlers that report it."""

    def __init__(self, serving: Callable[[], bool], *, poll_s: float = 1.0) -> None:
        self._serving = serving
        self._poll_s = poll_s
        self._draining = False
        self._changed = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self) -> None:
        """NOT_SERVING from now on, for every service (the start of a drain or shutdown)."""
        if not self._draining:
            log.info("health: NOT_SERVING (draining)")
        self._draining = True
        self._changed.set()

    def status(self, service: str = "") -> int:
        """The ServingStatus of ``service``; SERVICE_UNKNOWN for a name this server does not serve."""
        if service not in SERVICES:
            return SERVICE_UNKNOWN
        if self._draining:
            return NOT_SERVING
        try:
            return SERVING if self._serving() else NOT_SERVING
        except Exception:  # noqa: BLE001 - a probe must answer; a bug here reads as not serving
            log.exception("health: evaluating the status failed")
            return NOT_SERVING

    def handler(self) -> grpc.GenericRpcHandler:
        """Check and Watch as generic handlers, for any grpc.aio server."""
        return _Handler(self)

    async def check(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        service = _service(request)
        status = self.status(service)
        if status == SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        return health_pb2.HealthCheckResponse(status=status).SerializeToString()

    async def watch(self, request: bytes, context: grpc.aio.ServicerContext):
        service = _service(request)
        last = None
        while True:
            status = self.status(service)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status).SerializeToString()
            if self._draining:  # final; the stream stays open until the client or the server ends it
                await asyncio.sleep(self._poll_s)
            else:  # set only by set_draining, never cleared
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self._poll_s)


def _service(request: bytes) -> str:
    try:
        return health_pb2.HealthCheckRequest.FromString(request).service
    except Exception:  # noqa: BLE001 - a malformed request asks for no known service
        return "\0malformed"


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, health: Health) -> None:
        self._handlers = {
            CHECK_PATH: grpc.unary_unary_rpc_method_handler(health.check),
            WATCH_PATH: grpc.unary_stream_rpc_method_handler(health.watch),
        }

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)
