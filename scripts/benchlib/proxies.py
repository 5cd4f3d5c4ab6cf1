"""The proxies the benchmarks start in front of a node, besides tfscache: nginx ``grpc_pass`` and
the naive grpc.aio byte hop (the floor a Python gRPC proxy reaches), each in its own process.

Run as ``python -m benchlib.proxies --naive-hop TARGET --listen ADDR --ports-file F`` (from
scripts/) it is the naive hop; start_hop does that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from benchlib.cpu import Meter, proxy_meter

SCRIPTS = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
NGINX_INSTALL = "apt-get install nginx-light"


def stop(process: subprocess.Popen, grace: float = 60) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_file(path: Path, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Until ``path`` exists; SystemExit if ``process`` exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"{what} did not start (exit {process.returncode})")
        time.sleep(0.01)


# -- listening addresses for the proxies this script starts ----------------------------------

def listen_address(workdir: Path, name: str, transport: str) -> str:
    """Where a proxy this script starts listens, as a gRPC client dials it: ``unix:PATH`` (no port
    to pick: nothing can take it first), or ``127.0.0.1:PORT`` with ``transport`` "tcp".
    A TCP port is found by binding port 0 and closing it, and the proxy binds it right after:
    another process may take it in between (nginx cannot listen on port 0 and tell its port).
    The race is accepted for this like-for-like mode (tfscache's public ports are TCP)."""
    if transport == "unix":
        return f"unix:{workdir / f'{name}.sock'}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# -- the naive byte hop: the floor a Python gRPC front end can reach ---------------------------

async def _naive_hop(target: str, listen: str, ports_file: Path) -> None:
    """A grpc.aio server that sends each unary call's bytes on to ``target`` and its answer back:
    one channel, no metadata, no routing, no lease, no accounting."""
    channel = grpc.aio.insecure_channel(target)
    handlers: dict[str, grpc.RpcMethodHandler] = {}

    def handler(path: str) -> grpc.RpcMethodHandler:
        call = channel.unary_unary(path)

        async def forward(request: bytes, context) -> bytes:
            return await call(request, timeout=context.time_remaining())

        return grpc.unary_unary_rpc_method_handler(forward)

    class Generic(grpc.GenericRpcHandler):
        def service(self, details):
            found = handlers.get(details.method)
            if found is None:
                found = handlers[details.method] = handler(details.method)
            return found

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([Generic()])
    if not server.add_insecure_port(listen):
        raise SystemExit(f"the naive hop cannot listen on {listen}")
    await server.start()
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"target": listen, "pid": os.getpid()}))
    tmp.rename(ports_file)
    await server.wait_for_termination()


def start_hop(target: str, workdir: Path, transport: str = "unix") -> tuple[subprocess.Popen, str]:
    """The naive hop in its own process in front of ``target``; the address clients dial."""
    ports_file = workdir / f"hop-{time.monotonic_ns()}.json"
    listen = listen_address(workdir, "hop", transport)
    process = subprocess.Popen([PYTHON, "-m", "benchlib.proxies", "--naive-hop", target, "--listen", listen,
                                "--ports-file", str(ports_file)], cwd=SCRIPTS, stdin=subprocess.DEVNULL)
    wait_for_file(ports_file, process, "the naive hop")
    return process, json.loads(ports_file.read_text())["target"]


# -- nginx grpc_pass --------------------------------------------------------------------------

def nginx_binary(search: str | None = None) -> str | None:
    """``nginx`` in ``search`` (directories, as PATH spells them; default: PATH, then /usr/sbin, where
    Debian puts it)."""
    if search is None:
        search = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    return shutil.which("nginx", path=search)


_NGINX_CONF = """\
# written by scripts/benchlib.py: nginx as a plain gRPC proxy in front of one node
daemon off;
master_process on;
worker_processes 1;  # HAProxy's data plane runs one thread (nbthread 1)
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000000;  # else nginx closes a client's connection after 1000 requests
    upstream node {{
        server {upstream};
        keepalive 64;  # connections to the node are reused, as the node's own clients reuse theirs
        keepalive_requests 100000000;
    }}
    server {{
        listen {listen} http2;
        location / {{ grpc_pass grpc://node; }}
    }}
}}
"""


def start_nginx(upstream: str, workdir: Path, transport: str = "unix",
                search: str | None = None) -> tuple[subprocess.Popen | None, str]:
    """nginx (one worker, HTTP/2 in, ``grpc_pass`` with keep-alive to ``upstream``), started with its
    configuration in ``workdir/nginx``: (process, the address clients dial), or (None, why not).
    ``search``: where to look for the binary (nginx_binary)."""
    binary = nginx_binary(search)
    if binary is None:
        return None, f"nginx not found on PATH nor in /usr/sbin: {NGINX_INSTALL}"
    home = workdir / "nginx"
    home.mkdir(exist_ok=True)
    target = listen_address(home, "grpc", transport)  # nginx's listen takes both forms as they are
    (home / "nginx.conf").write_text(_NGINX_CONF.format(dir=home, upstream=upstream, listen=target))
    with open(home / "nginx-stderr.log", "ab") as log:
        process = subprocess.Popen([binary, "-p", str(home), "-c", str(home / "nginx.conf"), "-e",
                                    str(home / "nginx-error.log")], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not _answers(target):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            text = (home / "nginx-error.log").read_text(errors="replace")[-1500:] if (
                home / "nginx-error.log").exists() else ""
            return None, f"nginx did not start (exit {process.returncode}): {text.strip()}"
        time.sleep(0.02)
    return process, target


def _answers(target: str) -> bool:
    """Whether something accepts connections at ``target`` (unix:PATH or host:port)."""
    family, address = (socket.AF_UNIX, target[5:]) if target.startswith("unix:") else (
        socket.AF_INET, (target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1])))
    try:
        with socket.socket(family) as sock:
            sock.settimeout(1)
            sock.connect(address)
        return True
    except OSError:
        return False


def proxy_paths(direct: str, node_pid: int, workdir: Path,
                transport: str = "unix") -> tuple[dict[str, str], dict[str, Meter], list, dict[str, str]]:
    """The paths that are not tfscache, in front of the node at ``direct``: direct itself, nginx
    grpc_pass (where nginx is installed; else the reason, printed) and the naive hop. Returns the
    targets and meters by label, the processes started (the caller stops them) and the paths
    skipped with why."""
    targets, meters = {"direct": direct}, {"direct": proxy_meter("direct", None, node_pid)}
    started, skipped = [], {}
    nginx, nginx_target = start_nginx(direct, workdir, transport)
    if nginx is None:
        skipped["nginx grpc_pass"] = nginx_target
        print(f"skipping nginx grpc_pass: {nginx_target}", file=sys.stderr)
    else:
        started.append(nginx)
        targets["nginx grpc_pass"] = nginx_target
        meters["nginx grpc_pass"] = proxy_meter("nginx", nginx.pid, node_pid)
    hop, targets["naive hop"] = start_hop(direct, workdir, transport)
    started.append(hop)
    meters["naive hop"] = proxy_meter("naive hop", hop.pid, node_pid)
    return targets, meters, started, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description="the naive grpc.aio byte hop (started by start_hop)")
    parser.add_argument("--naive-hop", required=True, help="the target it forwards to")
    parser.add_argument("--listen", required=True, help="where it listens (unix:PATH or host:port)")
    parser.add_argument("--ports-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_naive_hop(args.naive_hop, args.listen, args.ports_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
