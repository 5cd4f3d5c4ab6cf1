"""`python -m tfscache.workers.worker`: one worker process of `tfscache serve --workers N`.

It serves the SAME GrpcFrontend and RestFrontend as a single process, on the public ports shared
with its siblings (SO_REUSEPORT), with grpc.health.v1 on its gRPC port, over a ``WorkerRouter``
(tfscache.workers.router). Its settings come from the control process as JSON in the environment
(``TFSCACHE_WORKER``). It dies with the control process: PR_SET_PDEATHSIG(SIGKILL), and it exits
when the control channel closes. SIGTERM, or the control process's ``stop``, drains it: health
NOT_SERVING, no new connections, requests in flight finish within ``grace``. SIGHUP re-reads the
[tls] files. SIGINT is the control process's to handle (a terminal sends it to the whole group).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from tfscache import logs
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.health import Health
from tfscache.frontend.rest import RestFrontend
from tfscache.frontend.upstream import Upstream, http_session
from tfscache.kinds.table import KINDS
from tfscache.observe.metrics import Metrics, NodeEvents
from tfscache.observe.requestlog import RequestLog
from tfscache.observe.workermetrics import Snapshots
from tfscache.repository.local import ModelRepository
from tfscache.settings.sections import ScaleSection, ServerSection, TlsSection
from tfscache.tls import ServerTls
from tfscache.workers.channel import ChannelClosed, connect
from tfscache.workers.delegation import Delegations, Grant
from tfscache.workers.router import WorkerRouter

log = logging.getLogger("tfscache.workers.worker")

ENV = "TFSCACHE_WORKER"
REPORT_S = 0.1  # usage reaches the control process at least this often
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class Worker:
    """One worker: front ends, health, delegations, and the channel to the control process."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.index: int = config["index"]
        self.server = ServerSection(**config["server"])
        self.tls_section = TlsSection(**config["tls"])
        self.protocol = KINDS[config["kind"]].part("protocol")
        self.delegations = Delegations()
        # Its own counts, sent in its reports and merged into the control's /metrics; the request
        # log's rows of what it served under its delegations (tfscache.observe.workermetrics, requestlog).
        self.metrics = Metrics(
            per_model=self.server.metrics_per_model,
            scale=ScaleSection(**config["scale"]),
            request_log=RequestLog(config["request_log"]) if config.get("request_log") else None,
        )
        self._events: dict[str, NodeEvents] = {}
        self.serving = False  # the control process's health, as it last said
        self.stopping = asyncio.Event()
        self._grace = self.server.grace_s
        self._nodes: dict[str, Upstream] = {}
        self._tasks: set[asyncio.Task] = set()
        self.tls: ServerTls | None = None
        # What goes in each report's ``metrics`` field (JSON-able): this process's cumulative counts
        # (tfscache.observe.workermetrics), summed into the control process's /metrics.
        # ``report_metrics(last)``: None when not due (Snapshots: every 0.5 s while busy; always at the last).
        self.report_metrics: Callable[[bool], object] | None = Snapshots(self.metrics).take

    def _node(self, grant: Grant) -> Upstream:
        upstream = self._nodes.get(grant.grpc)
        if upstream is None:
            upstream = self._nodes[grant.grpc] = Upstream(
                grant.grpc,
                grant.rest,
                self._http,
                max_send_bytes=self.server.max_receive_message_bytes,
                max_receive_bytes=self.server.max_send_message_bytes,
            )
        return upstream

    def _want(self, asked) -> None:
        with contextlib.suppress(ChannelClosed):
            self.channel.send({"op": "want", "name": asked[0], "version": asked[1]})

    async def run(self) -> int:
        config, server = self.config, self.server
        self.channel = await connect(config["socket"])
        self.channel.send({"op": "hello", "index": self.index, "pid": os.getpid()})
        self._http = http_session()
        internal = config["internal"]
        control = Upstream(
            f"127.0.0.1:{internal['grpc']}",
            f"127.0.0.1:{internal['rest']}" if internal.get("rest") else None,
            self._http,
            max_send_bytes=server.max_receive_message_bytes,
            max_receive_bytes=server.max_send_message_bytes,
        )
        layout = KINDS[config["kind"]].repository_layout()
        repository = ModelRepository(config["repository"], rescan_s=config["rescan_s"],
                                     layout=layout) if config.get("repository") else None
        router = WorkerRouter(control, self.delegations, want=self._want, node_upstream=self._node,
                              repository=repository, served=self._served)
        if self.metrics.request_log is not None:
            await self.metrics.request_log.start()
        if self.tls_section.cert_file:
            self.tls = await asyncio.to_thread(ServerTls, self.tls_section)
        ports = config["ports"]
        self._grpc = GrpcFrontend(
            router,
            bind_address=server.bind_address,
            port=ports["grpc"],
            max_send_bytes=server.max_send_message_bytes,
            max_receive_bytes=server.max_receive_message_bytes,
            protocol=self.protocol,
            metrics=self.metrics,
            reuse_port=True,
            credentials=self.tls.grpc_credentials() if self.tls else None,
        )
        self.health = Health(
            lambda: self.serving, services=self.protocol.health_services, poll_s=REPORT_S
        )
        self._grpc.add_handlers([self.health.handler()])
        await self._grpc.start()
        await self.health.start()
        self._rest = None
        if ports.get("rest") is not None:
            self._rest = RestFrontend(
                router,
                bind_address=server.bind_address,
                port=ports["rest"],
                max_receive_bytes=server.max_receive_message_bytes,
                timeout_s=server.rest_timeout_s,
                metrics=self.metrics,
                protocol=self.protocol,
                ssl_context=self.tls.ssl_context if self.tls else None,
                reuse_port=True,
                refusal_log_period_s=server.refusal_log_period_s,
            )
            await self._rest.start()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(
            signal.SIGHUP, lambda: self._spawn(self.tls.reload()) if self.tls else None
        )
        self.channel.send({"op": "ready", "index": self.index})
        log.info("worker %d serving (pid %d)", self.index, os.getpid())
        reader = asyncio.create_task(self._read())
        reporter = asyncio.create_task(self._report())
        stopping = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([reader, stopping], return_when=asyncio.FIRST_COMPLETED)
        lost = reader.done()  # the control process is gone: no one to drain for
        # While draining, revocations are still read and acknowledged, and usage still reported.
        await self._stop(0 if lost else self._grace)
        reporter.cancel()
        reader.cancel()
        if self.metrics.request_log is not None:
            await self.metrics.request_log.close()
        await router.close()
        for upstream in self._nodes.values():
            await upstream.close()
        await self._http.close()
        return 0

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _served(self, grant: Grant) -> None:
        """A request served under ``grant``: a cache hit on its node, counted here (and its row in
        the request log, written when the request ends)."""
        node, name, version = grant.held
        events = self._events.get(node)
        if events is None:
            events = self._events[node] = self.metrics.cache_events(node)
        events.hit((name, version))

    async def _stop(self, grace: float) -> None:
        log.info("worker %d stopping (grace %.1f s)", self.index, grace)
        self.health.set_draining()
        stops = [self._grpc.stop(grace)]
        if self._rest is not None:
            stops.append(asyncio.wait_for(self._rest.stop(), grace + 1.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.gather(*stops)
        await self.health.stop()
        with contextlib.suppress(ChannelClosed):
            self._send_report(last=True)
            await self.channel.drain()
        await self.channel.close()

    async def _read(self) -> None:
        with contextlib.suppress(ChannelClosed):
            while True:
                message = await self.channel.receive()
                op = message["op"]
                if op == "grant":
                    ttl = message.get("ttl")
                    node, name, version = message["held"]
                    self.metrics.costs[(node, (name, version))] = tuple(
                        message.get("cost", (0.0, 0))
                    )
                    self.delegations.add(
                        Grant(
                            (message["name"], message["asked"]),
                            tuple(message["held"]),
                            message["grpc"],
                            message.get("rest"),
                            expires=None if ttl is None else time.monotonic() + ttl,
                        )
                    )
                elif op == "refuse":
                    self.delegations.refused((message["name"], message["asked"]))
                elif op == "revoke":
                    grants = self.delegations.revoke(tuple(message["held"]))
                    self._spawn(self._ack(message["id"], grants))
                elif op == "health":
                    self.serving = message["serving"]
                elif op == "stop":
                    self._grace = message.get("grace", self._grace)
                    self.stopping.set()

    async def _ack(self, revocation_id: int, grants: list[Grant]) -> None:
        """Acknowledge a revocation once no request is in flight on it here."""
        for grant in grants:
            await grant.idle.wait()
        with contextlib.suppress(ChannelClosed):
            self.channel.send({"op": "ack", "id": revocation_id})

    def _send_report(self, last: bool = False) -> None:
        metrics = self.report_metrics(last) if self.report_metrics is not None else None
        self.channel.send({"op": "report", "usage": self.delegations.report(), "metrics": metrics})

    async def _report(self) -> None:
        """Usage every REPORT_S: requests, last use and in-flight per node version, and for
        tfscache.observe a ``metrics`` field (``report_metrics(last)``: this process's cumulative
        counts when due, tfscache.observe.workermetrics.Snapshots; else None)."""
        with contextlib.suppress(ChannelClosed):
            while True:
                await asyncio.sleep(REPORT_S)
                self._send_report()
                await self.channel.drain()


def main() -> int:
    config = json.loads(os.environ[ENV])
    die_with_parent(config["control_pid"])
    # the control process's to handle, from the first instant
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.setup(config.get("log_level", "INFO"), json_lines=config.get("log_json", False))
    logs.set_worker(config["index"])  # every line it writes names it
    return asyncio.run(Worker(config).run())


if __name__ == "__main__":
    sys.exit(main())
