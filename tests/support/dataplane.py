"""A ``tfscache serve --data-plane haproxy``'s HAProxy, asked over its runtime socket.

The socket is where the serve put it (tfscache.dataplane.config.runtime_socket_for): in
``STATE/dataplane``, or, when that path is too long for a UNIX socket (a deep temporary
directory), in a directory of its own named by the state directory's hash.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from support.waiting import within

from tfscache.app import ServeApp
from tfscache.dataplane import config


def dataplane_dir(serve) -> Path:
    """``STATE/dataplane``: HAProxy's configuration and its map of routes."""
    return Path(serve.state_dir) / "dataplane"


def runtime_socket(serve) -> Path:
    return config.runtime_socket_for(dataplane_dir(serve))


def runtime_command(serve, line: str) -> str:
    """One command on the serve's HAProxy runtime socket -> its answer."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(runtime_socket(serve)))
        sock.sendall(line.encode() + b"\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.decode()


def routed_by_key(serve) -> dict[str, int]:
    """Requests HAProxy routed, by stick-table key (MODEL@NODE), from ``show table inflight``."""
    routed: dict[str, int] = {}
    for line in runtime_command(serve, "show table inflight").splitlines():
        if "key=" in line and "http_req_cnt=" in line:
            key = line.split("key=", 1)[1].split()[0]
            routed[key] = int(line.rsplit("http_req_cnt=", 1)[1].split()[0])
    return routed


def serving_peer(serve, peer: str) -> bool:
    """The serve's HAProxy serves with ``peer``'s backend: the worker reloaded with it answers."""
    return f"grpc_{peer} " in runtime_command(serve, "show servers state")


def old_workers_listen(app) -> bool:
    """An old HAProxy worker of ``app`` still listens on a public port (for a moment after a
    reload it may still accept a connection; it lives on while a client keeps one open)."""
    supervisor = app.dataplane.supervisor
    try:
        workers = psutil.Process(supervisor.process.pid).children()
        return any(connection.status == psutil.CONN_LISTEN
                   for worker in workers if worker.pid != supervisor.runtime.worker
                   for connection in worker.net_connections(kind="inet"))
    except psutil.NoSuchProcess:
        return False


async def served_with_peer(app, peer: str) -> bool:
    """``app``'s HAProxy serves with ``peer``'s backend, and its worker alone: an old worker can
    still accept a connection for a moment after the new one answers, and a request it takes is
    counted in its own tables (``missed`` too), which the control plane no longer reads."""
    return serving_peer(app, peer) and await app.dataplane.supervisor.old_workers_gone()


def server_stats(serve) -> dict[tuple[str, str], dict[str, str]]:
    """HAProxy's counters (``show stat``) by (backend, server): ``stot`` (requests sent there),
    ``econ`` (connections that failed, a TLS handshake's included), ``status`` (UP, DOWN)."""
    lines = runtime_command(serve, "show stat").splitlines()
    names = lines[0].removeprefix("# ").split(",")
    rows = [dict(zip(names, line.split(","))) for line in lines[1:] if line]
    return {(row["pxname"], row["svname"]): row for row in rows}


@contextlib.asynccontextmanager
async def serving(settings, prepare=None) -> AsyncIterator:
    """An in-process ``ServeApp`` on ``settings``, started, with ``target`` (its public gRPC
    address) and ``rest`` (its public REST URL) set; stopped on exit. ``prepare(app)`` runs
    before the start (a test's clock, say)."""
    app = ServeApp(settings)
    if prepare is not None:
        prepare(app)
    grpc_port, rest_port = await app.start()
    app.target, app.rest = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{rest_port}"
    try:
        yield app
    finally:
        await within(app.stop(0), 120, "the control plane's stop")
