"""The requests HAProxy routed, read back from its log (``server.data_plane = haproxy``).

HAProxy writes one raw line per routed request (``config.LOG_FORMAT``) to a UNIX datagram
socket that this module binds. Each line becomes a ``Routed``: the method as the front end
names it, the code as the front end would count it, the latency, the model and the node. The
control plane hands those to the request metrics and the request log (``Metrics.answered``), so
a routed request is counted as one the front end answered is. Requests that HAProxy did not
route (the slow path, and a routed one that fell back to the front end) are logged by the front
end and not here.

What is coarser than on the Python path: HAProxy times in whole milliseconds, and a gRPC
reply's code is read from its headers. A reply with no message carries ``grpc-status`` there
(trailers-only: how servers answer an error); one with a message has it in its trailers, which
HAProxy 2.6 cannot read, so it counts as OK once its HTTP status is 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from tfscache.dataplane.config import LOG_MARK

log = logging.getLogger("tfscache.dataplane")

FALLBACK = "python"  # the backup server: the front end, which counts what it answers
_CODES = {code.value[0]: code.name for code in grpc.StatusCode}
# gRPC's mapping of an HTTP status with no grpc-status to a code (doc/http-grpc-status-mapping.md
# in grpc/grpc)
_HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
                 503: "UNAVAILABLE", 504: "UNAVAILABLE"}


@dataclass(frozen=True)
class Routed:
    """One request HAProxy sent straight to a node and the node answered."""

    time: float  # when it arrived, epoch seconds
    protocol: str  # grpc, rest
    method: str  # as the front end names it: Predict, ModelInfer...
    code: str  # gRPC code name, or the HTTP status
    seconds: float
    model: str
    node_id: str  # the node's name in haproxy.cfg


def parse(line: str, rest_methods: dict[str, str]) -> Routed | None:
    """The request one log line tells of; None for any other line (a server going down, a
    request that the front end answered as the backup)."""
    fields = line.strip().split(" ")
    if len(fields) != 10 or fields[0] != LOG_MARK or fields[3] == FALLBACK:
        return None
    _, arrived, protocol, _server, status, active_ms, model, node_id, grpc_status, path = fields
    try:
        time_s, http, seconds = float(arrived), int(status), max(0, int(active_ms)) / 1000
    except ValueError:
        return None
    if protocol == "grpc":
        method = path.rsplit("/", 1)[-1]
        if grpc_status.isdigit():
            code = _CODES.get(int(grpc_status), "UNKNOWN")
        else:
            code = "OK" if http == 200 else _HTTP_TO_GRPC.get(http, "UNKNOWN")
    else:
        word = path.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        method, code = rest_methods.get(word, word), str(http)
    return Routed(time_s, protocol, method, code, seconds, model, node_id)


class _Reader(asyncio.DatagramProtocol):
    def __init__(self, told: Callable[[str], None]) -> None:
        self._told = told

    def datagram_received(self, data: bytes, addr) -> None:
        try:
            self._told(data.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - one bad line must not stop the reader
            log.exception("data plane: a routed request's log line failed")

    def error_received(self, exc: Exception) -> None:
        log.debug("data plane log socket: %s", exc)


class RequestLog:
    """The datagram socket HAProxy logs routed requests to; ``told(Routed)`` for each."""

    def __init__(self, path: Path, rest_methods: dict[str, str],
                 told: Callable[[Routed], None]) -> None:
        self.path = path
        self._rest_methods = rest_methods
        self._told = told
        self._transport: asyncio.DatagramTransport | None = None

    async def start(self) -> None:
        await asyncio.to_thread(_unlink, self.path)  # left by an earlier run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(os.fsencode(self.path))
            os.chmod(self.path, 0o600)
            # bursts of lines wait here while the event loop is busy; a full buffer makes
            # HAProxy drop lines (counted in its `show info` DroppedLogs), never block
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            sock.close()
            raise
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _Reader(self._line), sock=sock)

    def _line(self, line: str) -> None:
        routed = parse(line, self._rest_methods)
        if routed is not None:
            self._told(routed)

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        await asyncio.to_thread(_unlink, self.path)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
