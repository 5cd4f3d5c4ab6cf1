"""What one `tfscache serve` tells about itself: its metrics (and the request log they write,
docs/metrics.md), and the metrics and status port (tfscache.observe)."""

from __future__ import annotations

from tfscache.cluster.spread import Spread
from tfscache.cluster.topology import Topology
from tfscache.observe.metrics import Metrics
from tfscache.observe.requestlog import RequestLog
from tfscache.observe.server import ObserveServer, watch
from tfscache.settings import Settings


class Telemetry:
    """``metrics`` from the start; ``open_log()`` first of all, ``serve()`` last: the port answers
    scrapes until ``stop()``, after everything else."""

    def __init__(self, settings: Settings, topology: Topology) -> None:
        server = settings.server
        self._server = server
        self._topology = topology
        self.metrics = Metrics(per_model=server.metrics_per_model, scale=settings.scale,
                               request_log=RequestLog(server.request_log) if server.request_log
                               else None)
        watch(self.metrics, topology)
        self._observe: ObserveServer | None = None
        self.port: int | None = None

    async def open_log(self) -> None:
        """--request-log: opened (or refused) before anything starts."""
        if self.metrics.request_log is not None:
            await self.metrics.request_log.start()

    async def serve(self, *, tier, spread: Spread | None) -> int | None:
        """The metrics and status port (``server.metrics_port``; negative: none)."""
        if self._server.metrics_port >= 0:
            self._observe = ObserveServer(self.metrics, self._topology,
                                          bind_address=self._server.bind_address,
                                          port=self._server.metrics_port, tier=tier, spread=spread,
                                          token=self._server.admin_token)
            self.port = await self._observe.start()
        return self.port

    async def stop(self) -> None:
        if self._observe is not None:
            await self._observe.stop()
        if self.metrics.request_log is not None:
            await self.metrics.request_log.close()
