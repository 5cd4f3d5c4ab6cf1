"""The REST hop notices a server that went silent mid-request (its host cut off: packets dropped,
no reset), as the gRPC hop does with its pings (docs/reliability.md).

A plain HTTP server in a network namespace reads a request and never answers. The front end's
HTTP client (``tfscache.frontend.upstream.http_session``, what `tfscache serve` forwards REST
requests with) sends it a request; once the server has read it, the host's link is cut. The
request must end UNAVAILABLE, which the router retries on another replica, and not wait for
its 60 s timeout (DEADLINE_EXCEEDED, never retried: the soak's failed REST requests), whether the
request was acknowledged before the cut (the keep-alive probes find the silence) or not (nothing
acknowledged within TCP_USER_TIMEOUT). A host that stays up but answers late keeps its request: its kernel answers the
probes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from support.netns import Network, unavailable
from tfscache import errors
from tfscache.frontend.upstream import Upstream, http_session

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}")

# Reads one request per connection, says so on stdout, then answers only once the file named in
# the request's path exists (never, for a path no test creates).
_SILENT = r'''
import os, socket, sys, threading, time
def serve(conn):
    data = b""
    while True:  # requests on one kept-alive connection, in turn
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, data = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(data) < length:
            data += conn.recv(65536)
        data = data[length:]
        path = head.split(b" ")[1].decode()
        print("read", path, flush=True)
        while not os.path.exists(path):
            time.sleep(0.05)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
server = socket.create_server(("0.0.0.0", 8501))
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


@pytest.fixture(scope="module")
def silent_host(tmp_path_factory):
    directory = tmp_path_factory.mktemp("liveness")
    with Network() as net:
        host = net.host("silent")
        log = directory / "server.log"
        host.popen([sys.executable, "-c", _SILENT], log)
        yield host, log


def _read(log, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while f"read {path}" not in log.read_text():
        assert time.monotonic() < deadline, f"the server never read {path}: {log.read_text()}"
        time.sleep(0.02)  # polling a condition with a deadline


async def _upstream(host, http):
    return Upstream(f"{host.address}:8500", f"{host.address}:8501", http, max_send_bytes=1 << 20,
                    max_receive_bytes=1 << 20)


async def _connect(host, http, upstream, tmp_path) -> None:
    """Wait until the server listens (a first request answered), so the connection is pooled."""
    ok = tmp_path / "ok"
    ok.touch()
    deadline = time.monotonic() + 30
    while True:
        try:
            await upstream.rest("GET", str(ok), b"", {}, timeout=5)
            return
        except errors.Unavailable:
            assert time.monotonic() < deadline, "the silent server never listened"
            await asyncio.sleep(0.05)  # polling a condition with a deadline


async def test_a_late_answer_on_a_live_host_is_kept(silent_host, tmp_path):
    host, log = silent_host
    async with http_session() as http:
        upstream = await _upstream(host, http)
        await _connect(host, http, upstream, tmp_path)
        release = tmp_path / "release"
        call = asyncio.ensure_future(upstream.rest("POST", str(release), b"{}", {}, timeout=60))
        await asyncio.to_thread(_read, log, str(release))
        await asyncio.sleep(4)  # longer than the probes' 3 s: a live host's kernel answers them
        assert not call.done()
        release.touch()
        assert (await call).status == 200
        await upstream.close()


def _acknowledged(host, timeout: float = 30.0) -> None:
    """Wait until the connection to ``host`` has nothing unacknowledged (``ss``: Send-Q 0)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = subprocess.run(["ss", "-Htn", "state", "established", "dst", host.address], capture_output=True,
                              text=True, check=True).stdout.split("\n")
        queues = [int(row.split()[1]) for row in rows if row.strip()]
        if queues and all(q == 0 for q in queues):
            return
        assert time.monotonic() < deadline, f"the request to {host.address} was never acknowledged: {rows}"
        time.sleep(0.01)  # polling a condition with a deadline


@pytest.mark.parametrize("when", ["acknowledged", "as_read"])
async def test_a_request_to_a_host_cut_off_mid_call_ends_unavailable(silent_host, tmp_path, when):
    """Cut once the request's bytes are acknowledged (the keep-alive probes find it), or as soon as the
    server has read them, usually before its delayed ACK left (TCP_USER_TIMEOUT finds it)."""
    host, log = silent_host
    async with http_session() as http:
        upstream = await _upstream(host, http)
        await _connect(host, http, upstream, tmp_path)
        never = tmp_path / "never"
        call = asyncio.ensure_future(upstream.rest("POST", str(never), b"{}", {}, timeout=60))
        await asyncio.to_thread(_read, log, str(never))
        if when == "acknowledged":
            await asyncio.to_thread(_acknowledged, host)
        host.cut()
        try:
            with pytest.raises(errors.NodeUnavailable, match=f"REST request to {host.address}:8501 failed"):
                await call
        finally:
            host.heal()
            await upstream.close()
