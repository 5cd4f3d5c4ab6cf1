"""The front ends of one `tfscache serve`: gRPC and REST over the router, speaking the node
kind's protocol. With ``server.workers`` > 1 these are the control process's internal
listeners (127.0.0.1, plain, uncounted) and the workers serve the public ports (docs/workers.md);
with ``server.data_plane = haproxy`` HAProxy does (docs/data-plane.md)."""

from __future__ import annotations

from pathlib import Path

import grpc

from tfscache.app.credentials import Credentials
from tfscache.dataplane.control import DataPlane
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.rest import RestFrontend
from tfscache.frontend.router import Router
from tfscache.observe.metrics import Metrics
from tfscache.settings.sections import ServerSection
from tfscache.workers.control import WorkerPool, internal


class Frontends:
    """``start()`` returns the public (gRPC, REST) ports; REST is None with ``server.rest_port``
    < 0."""

    def __init__(self, server: ServerSection, *, protocol, metrics: Metrics,
                 credentials: Credentials, workers: WorkerPool | None,
                 dataplane: DataPlane | None = None) -> None:
        self._server = server
        self._protocol = protocol  # the API the front ends speak (the node kind's)
        self._metrics = metrics
        self._credentials = credentials
        self._workers = workers
        self._dataplane = dataplane
        self._grpc: GrpcFrontend | None = None
        self._rest: RestFrontend | None = None

    async def start(self, router: Router, *, state_dir: Path,
                    rescan_s: float) -> tuple[int, int | None]:
        """Serve ``router``; ``state_dir`` and the repository's ``rescan_s``: what the workers are
        told."""
        s = self._server
        if self._workers:
            fe, tls, metrics = internal(s, self._metrics)
        elif self._dataplane:  # behind HAProxy: internal, plain, each request counted here
            fe, tls, metrics = internal(s, self._metrics)[0], None, self._metrics
        else:
            fe, tls, metrics = s, self._credentials.server, self._metrics
        self._grpc = GrpcFrontend(router, bind_address=fe.bind_address, port=fe.grpc_port,
                                  max_send_bytes=s.max_send_message_bytes,
                                  max_receive_bytes=s.max_receive_message_bytes,
                                  protocol=self._protocol, metrics=metrics,
                                  credentials=tls.grpc_credentials() if tls else None)
        grpc_port, rest_port = await self._grpc.start(), None
        if s.rest_port >= 0:
            self._rest = RestFrontend(router, bind_address=fe.bind_address, port=fe.rest_port,
                                      max_receive_bytes=s.max_receive_message_bytes,
                                      timeout_s=s.rest_timeout_s, metrics=metrics,
                                      protocol=self._protocol,
                                      ssl_context=tls.ssl_context if tls else None,
                                      refusal_log_period_s=s.refusal_log_period_s)
            rest_port = await self._rest.start()
        if self._workers is not None:  # the public ports, served by the workers from now on
            grpc_port, rest_port = await self._workers.start(grpc_port, rest_port,
                                                             state_dir=state_dir, rescan_s=rescan_s)
        if self._dataplane is not None:  # HAProxy on the public ports, these behind it
            grpc_port, rest_port = await self._dataplane.start(grpc_port, rest_port,
                                                               state_dir=state_dir)
        return grpc_port, rest_port

    def add_handlers(self, handlers: list[grpc.GenericRpcHandler]) -> None:
        """More services on the gRPC port (health)."""
        self._grpc.add_handlers(handlers)

    async def stop(self, grace: float) -> None:
        """Stop accepting requests and let those in flight finish (an embedded process drain);
        workers first."""
        if self._workers is not None:
            await self._workers.stop(grace)
        if self._dataplane is not None:
            await self._dataplane.stop(grace)
        if self._grpc is not None:
            await self._grpc.stop(grace)
        if self._rest is not None:
            await self._rest.stop()

