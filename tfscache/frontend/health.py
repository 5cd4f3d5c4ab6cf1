"""grpc.health.v1 Health on the front end's gRPC port, served by grpcio-health-checking.

SERVING while the process is not draining and ``serving()`` says so (serve.py passes
``Topology.serving``: its ring has a node, and its node (sidecar) or at least one of
its nodes (embedded) is healthy); NOT_SERVING otherwise. Load balancers and
Kubernetes readiness probes ask service ``""``; clients may ask for the protocol's
services (``Protocol.health_services``: TF Serving's PredictionService and ModelService, or
``inference.GRPCInferenceService``), which share that status. Another name gets NOT_FOUND from Check
and SERVICE_UNKNOWN from
Watch, as from gRPC's own servicer (which this is: ``grpc_health.v1``'s asyncio
``HealthServicer``).

The servicer holds statuses that are set, not asked for, so ``start()`` runs a task
that re-evaluates ``serving()`` every ``poll_s`` and sets every service's status when it
changed: Watch streams see a node going down within ``poll_s``. Check and a new Watch
re-evaluate first, so their first answer is never stale. ``set_draining()`` is the servicer's graceful
shutdown: every service turns NOT_SERVING for good, and Watch streams see it at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2

from tfscache.tasks import cancel

log = logging.getLogger("tfscache.frontend.health")

SERVICE = "grpc.health.v1.Health"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class _Servicer(health.aio.HealthServicer):
    """gRPC's asyncio servicer; Check and Watch refresh the status first (so neither starts from
    one up to ``poll_s`` old), and Check names an unknown service."""

    def __init__(self, refresh: Callable[[], Awaitable[None]], services: tuple[str, ...]) -> None:
        super().__init__()
        self._refresh = refresh
        self._services = services

    async def Check(self, request, context):  # noqa: N802 - the gRPC method's name
        if request.service not in self._services:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        await self._refresh()
        return await super().Check(request, context)

    async def Watch(self, request, context):  # noqa: N802 - the gRPC method's name
        await self._refresh()
        await super().Watch(request, context)


class Health:
    """Health status of one process, and the gRPC handler that reports it."""

    def __init__(
        self, serving: Callable[[], bool], *, services: tuple[str, ...], poll_s: float = 1.0
    ) -> None:
        """``services``: the names answered (the protocol's ``health_services``; "" is the server)."""
        self._serving = serving
        self._services = services
        self._poll_s = poll_s
        self._draining = False
        self._servicer = _Servicer(self.refresh, services)
        self._last: int | None = None
        self._poller: asyncio.Task | None = None
        self._shutdown: asyncio.Task | None = None

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self) -> None:
        """NOT_SERVING from now on, for every service (the start of a drain or shutdown)."""
        if self._draining:
            return
        log.info("health: NOT_SERVING (draining)")
        self._draining = True
        self._shutdown = asyncio.get_running_loop().create_task(
            self._servicer.enter_graceful_shutdown()
        )

    def status(self, service: str = "") -> int:
        """The ServingStatus of ``service``; SERVICE_UNKNOWN for a name this server does not serve."""
        if service not in self._services:
            return SERVICE_UNKNOWN
        if self._draining:
            return NOT_SERVING
        try:
            return SERVING if self._serving() else NOT_SERVING
        except Exception:  # noqa: BLE001 - a probe must answer; a bug here reads as not serving
            log.exception("health: evaluating the status failed")
            return NOT_SERVING

    async def refresh(self) -> None:
        """Set every service's status on the servicer if it changed (ignored once draining)."""
        status = self.status()
        if status != self._last:
            self._last = status
            for service in self._services:
                await self._servicer.set(service, status)

    def handler(self) -> grpc.GenericRpcHandler:
        """Check and Watch as a generic handler, for any grpc.aio server."""
        def method(kind, behaviour):
            return kind(behaviour, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                        response_serializer=health_pb2.HealthCheckResponse.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Check": method(grpc.unary_unary_rpc_method_handler, self._servicer.Check),
            "Watch": method(grpc.unary_stream_rpc_method_handler, self._servicer.Watch),
        })

    async def start(self) -> None:
        """Set the first statuses and poll ``serving()`` every ``poll_s`` until ``stop()``."""
        await self.refresh()
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        """Stop polling, once the graceful shutdown (if begun) is done; a second call does nothing."""
        poller, self._poller = self._poller, None
        if poller is not None:
            await cancel(poller)
        if self._shutdown is not None:
            await self._shutdown

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self.refresh()
