"""The control process's side of `tfscache serve --workers N` (docs/workers.md).

``WorkerPool`` reserves the public ports (a bound socket with SO_REUSEPORT: port 0 picks a free
one), starts N worker processes (tfscache.workers.worker) that serve them, talks to each over its
channel (tfscache.workers.channel), restarts one that dies (its delegations dropped at once), and
drains them all on stop. It grants delegations only for a version AVAILABLE on a local node that
the router would send the request to first (fixed replicas; with copies on, no delegation: the
copies rule picks by load per request), and records each; ``revoke`` (the caches' awaited hook
before an unload) takes them back and returns once every holder acknowledged or died. Workers'
usage reports go to the caches (tfscache.workers.usage: recency, counts and requests in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path

from tfscache import errors
from tfscache.frontend.health import SERVING, Health
from tfscache.workers.channel import Channel, ChannelClosed
from tfscache.workers.delegation import Grants
from tfscache.workers.usage import Usage, sole_resident
from tfscache.workers.worker import ENV, REPORT_S

log = logging.getLogger("tfscache.workers.control")

START_TIMEOUT_S = 60.0  # each worker serves within this at start-up
RESTART_BACKOFF_S = (0.1, 5.0)  # a worker that keeps dying is restarted at most this often
# a worker that ran this long before it died starts its backoff again from the first step
STABLE_S = 30.0


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: the port stays this
    process's for the workers to bind too; port 0 picks a free one (``getsockname`` says which)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def internal(server, metrics):
    """Worker mode: (server section, TLS, metrics) of the control process's own front ends, which only
    the workers reach: 127.0.0.1, ports picked, plain text, no request counted (the workers count;
    the request-log rows of what this process served are written here: ``Metrics.rows_only``)."""
    return (
        replace(
            server,
            bind_address="127.0.0.1",
            grpc_port=0,
            rest_port=0 if server.rest_port >= 0 else -1,
        ),
        None,
        metrics.rows_only(),
    )


class _Worker:
    """One worker slot: its process, channel and readiness (a restart fills the same slot)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None
        self.ready = asyncio.Event()
        self.serving: bool | None = None  # the health last sent
        self.restarts = 0
        self.started = 0.0  # monotonic
        self.in_flight = 0  # requests in flight under its delegations, as last reported


class WorkerPool:
    """N worker processes on the public ports; delegations granted, recorded and revoked."""

    def __init__(self, settings, *, nodes: Callable[[], dict], router: Callable[[], object],
                 health: Callable[[], Health | None], spread=None, metrics=None) -> None:
        """``nodes()``: local node backends by name; ``router()``: the control process's router
        (which backend a request goes to first); ``health()``: the process's health (None: not yet);
        ``spread``: copies that follow load (tfscache.cluster.spread.Spread), None when off.
        ``metrics``: the control process's Metrics: the workers' counts are merged into its /metrics,
        their list is its /status's, and grants carry its last load costs (tfscache.observe)."""
        self.settings = settings
        self.count = settings.server.workers
        self._nodes = nodes
        self._router = router
        self._health = health
        self._rescan_s = 1.0
        self.usage = Usage(nodes, spread)
        self.grants = Grants()
        self.workers = [_Worker(i) for i in range(self.count)]
        self.ports: dict[str, int | None] = {}
        self._reserved: list[socket.socket] = []
        self._server: asyncio.AbstractServer | None = None
        self._socket_path = ""
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()
        self.metrics = metrics
        # a worker's ``metrics`` report: merged into /metrics (tfscache.observe.workermetrics)
        self.on_metrics: Callable[[int, object], None] | None = (
            metrics.exported.update if metrics else None
        )
        if metrics is not None:
            metrics.exported.status = self.describe

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, internal_grpc: int, internal_rest: int | None, *, state_dir: Path,
                    rescan_s: float) -> tuple[int, int | None]:
        """Reserve the public ports, start the workers; returns (grpc_port, rest_port) once all serve.
        ``internal_*``: the control process's own listeners on 127.0.0.1; ``rescan_s``: how long the
        repository remembers a model's latest version (a delegation for "latest" lasts that long).
        """
        server = self.settings.server
        self._rescan_s = rescan_s
        grpc = reserve_port(server.bind_address, server.grpc_port)
        self._reserved.append(grpc)
        self.ports = {"grpc": grpc.getsockname()[1], "rest": None}
        if server.rest_port >= 0:
            rest = reserve_port(server.bind_address, server.rest_port)
            self._reserved.append(rest)
            self.ports["rest"] = rest.getsockname()[1]
        self._internal = {"grpc": internal_grpc, "rest": internal_rest}
        directory = str(state_dir)
        if len(directory) > 80:  # a Unix socket's path is at most 107 bytes
            directory = tempfile.mkdtemp(prefix="tfscache-workers-")
        # a killed control process's (the directory is ours)
        for stale in Path(directory).glob("workers-*.sock"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        self._socket_path = os.path.join(directory, f"workers-{os.getpid()}.sock")
        self._server = await asyncio.start_unix_server(self._connected, path=self._socket_path)
        self._spawn(self._push_health())
        for worker in self.workers:
            await self._launch(worker)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.gather(*(w.ready.wait() for w in self.workers))
        except TimeoutError:
            raise errors.Unavailable(
                f"workers did not serve within {START_TIMEOUT_S:.0f} s"
            ) from None
        log.info("%d workers serving on gRPC port %s, REST port %s", self.count, self.ports["grpc"],
                 self.ports["rest"])
        return self.ports["grpc"], self.ports["rest"]

    def _config(self, worker: _Worker) -> dict:
        s = self.settings
        root = None if "://" in s.model_repository else str(Path(s.model_repository).resolve())
        return {"index": worker.index, "control_pid": os.getpid(), "socket": self._socket_path,
                "ports": self.ports, "internal": self._internal, "kind": s.node.backend,
                "server": asdict(s.server), "tls": asdict(s.tls), "scale": asdict(s.scale),
                "repository": root, "rescan_s": self._rescan_s,
                "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                "log_json": bool(s.log_json), "request_log": s.server.request_log}

    async def _launch(self, worker: _Worker) -> None:
        worker.ready.clear()
        worker.started = time.monotonic()
        worker.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tfscache.workers.worker",
            env={**os.environ, ENV: json.dumps(self._config(worker))})
        self._spawn(self._watch(worker, worker.process))

    async def _watch(self, worker: _Worker, process: asyncio.subprocess.Process) -> None:
        """Restart the worker when its process exits while the pool runs."""
        rc = await process.wait()
        if self._stopping or worker.process is not process:
            return
        self._gone(worker.index)  # nothing it held blocks an unload from now on
        worker.channel = None
        worker.restarts = (
            1 if time.monotonic() - worker.started >= STABLE_S else worker.restarts + 1
        )
        delay = min(RESTART_BACKOFF_S[1], RESTART_BACKOFF_S[0] * 2 ** min(worker.restarts - 1, 6))
        log.warning(
            "worker %d (pid %d) exited with status %s; restarting it in %.1f s",
            worker.index,
            process.pid,
            rc,
            delay,
        )
        await asyncio.sleep(delay)
        if not self._stopping:
            await self._launch(worker)

    async def stop(self, grace: float) -> None:
        """Drain every worker (no new connections; requests in flight finish within ``grace``)."""
        if self._stopping:
            return
        self._stopping = True
        for worker in self.workers:
            if worker.channel is not None:
                with contextlib.suppress(ChannelClosed):
                    worker.channel.send({"op": "stop", "grace": grace})
            elif worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(self._reap(w, grace + 5.0) for w in self.workers))
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._socket_path)
        for sock in self._reserved:
            sock.close()

    async def _reap(self, worker: _Worker, timeout: float) -> None:
        process = worker.process
        if process is None:
            return
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            log.warning("worker %d did not stop within %.0f s; killing it", worker.index, timeout)
            process.kill()
            await process.wait()
        self._gone(worker.index)

    def _gone(self, index: int) -> None:
        """A worker died or stopped: its delegations and in-flight counts go at once."""
        self.grants.worker_gone(index)
        self.usage.worker_gone(index)
        self.workers[index].in_flight = 0
        if self.metrics is not None:  # its counters stay in /metrics, its gauges go
            self.metrics.exported.retire(index)

    def reload_tls(self) -> None:
        """SIGHUP: each worker re-reads the [tls] files."""
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGHUP)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the channel ---------------------------------------------------------------------

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer)
        worker = None
        try:
            hello = await channel.receive()
            worker = self.workers[hello["index"]]
            worker.channel, worker.serving = channel, None
            self._send_health(worker)
            while True:
                self._dispatch(worker, await channel.receive())
        except ChannelClosed:
            pass
        except Exception:  # noqa: BLE001 - a bad message ends that channel, not the process
            log.exception("worker channel failed")
        finally:
            if worker is not None and worker.channel is channel:
                worker.channel = None
                self._gone(worker.index)
            await channel.close()

    def _dispatch(self, worker: _Worker, message: dict) -> None:
        op = message["op"]
        if op == "want":
            self._answer(worker, message["name"], message["version"])
        elif op == "report":
            seen = self.usage.apply(worker.index, message["usage"])
            worker.in_flight = sum(row[5] for row in message["usage"])
            held = [pair for pair in seen if self.grants.held_for(*pair)]
            # copies spread it: routed here again
            for node, name in self.usage.moved(held, self._router()):
                self._spawn(self.revoke(node, [h[1:] for h in self.grants.held_for(node, name)]))
            if self.on_metrics is not None and message.get("metrics") is not None:
                self.on_metrics(worker.index, message["metrics"])
        elif op == "ack":
            self.grants.acked(worker.index, message["id"])
        elif op == "ready":
            worker.ready.set()

    def _answer(self, worker: _Worker, name: str, asked: int | None) -> None:
        """Grant ``(name, asked)`` if it is resident where the router sends it first; else refuse.
        No await between the check, the record and the send (tfscache.workers.delegation)."""
        grant = None if self._stopping else self.grantable(name, asked)
        if grant is None:
            worker.channel.send({"op": "refuse", "name": name, "asked": asked})
            return
        held = tuple(grant["held"])
        # once per delegation (a "latest" one is renewed)
        if worker.index not in self.grants.holders(held):
            log.info(
                "worker %d: delegated model %s version %s on %s",
                worker.index,
                held[1],
                held[2],
                held[0],
            )
        self.grants.granted(worker.index, held)
        worker.channel.send({"op": "grant", "name": name, "asked": asked, **grant})

    def grantable(self, name: str, asked: int | None) -> dict | None:
        """The delegation for a request naming ``name`` at ``asked`` (None: latest), or None."""
        found = sole_resident(self._router(), self.usage, name, asked)
        if found is None:
            return None
        backend, version = found
        upstream = backend.upstream
        cost = (
            self.metrics.costs.get((backend.name, (name, version)), (0.0, 0))
            if self.metrics
            else (0.0, 0)
        )
        return {
            "held": [backend.name, name, version],
            "grpc": upstream.grpc_address,
            "rest": upstream.rest_address,
            "ttl": self._rescan_s if asked is None else None,
            "cost": list(cost),
        }

    def describe(self) -> list[dict]:
        """The workers for /status: id, pid, requests in flight under delegations, restarts,
        delegations held."""
        return [
            {
                "id": w.index,
                "pid": w.process.pid if w.process is not None else None,
                "in_flight": w.in_flight,
                "restarts": w.restarts,
                "delegations": len(self.grants.held_by(w.index)),
            }
            for w in self.workers
        ]

    def revoker(self, node: str) -> Callable[[list], Awaitable[None]]:
        """The hook ``node``'s cache awaits before an unload (``CacheManager(before_unload=)``)."""
        return functools.partial(self.revoke, node)

    async def revoke(self, node: str, keys) -> None:
        """Before ``keys`` leave ``node``: every worker holding one stops starting requests on it,
        waits for those in flight, and acknowledges (a worker that dies meanwhile counts as done).
        """
        waits = []
        for name, version in keys:
            revocation = self.grants.revoke((node, name, version))
            if revocation.waiting:
                log.info(
                    "revoking model %s version %s on %s from worker(s) %s",
                    name,
                    version,
                    node,
                    sorted(revocation.waiting),
                )
            for index in revocation.waiting:
                channel = self.workers[index].channel
                try:
                    if channel is None:
                        raise ChannelClosed("gone")
                    channel.send(
                        {"op": "revoke", "held": [node, name, version], "id": revocation.id}
                    )
                except ChannelClosed:
                    self._gone(index)
            waits.append(revocation.done.wait())
        if waits:
            await asyncio.gather(*waits)

    async def _push_health(self) -> None:
        """The process's health to every worker, when it changes (checked every REPORT_S)."""
        while True:
            for worker in self.workers:
                if worker.channel is not None:
                    self._send_health(worker)
            await asyncio.sleep(REPORT_S)

    def _send_health(self, worker: _Worker) -> None:
        health = self._health()
        serving = health is not None and health.status() == SERVING and not self._stopping
        if serving != worker.serving:
            with contextlib.suppress(ChannelClosed):
                worker.channel.send({"op": "health", "serving": serving})
                worker.serving = serving
