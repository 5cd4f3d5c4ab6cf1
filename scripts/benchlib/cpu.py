"""CPU seconds by process group, read from /proc through psutil: a path's *meter* gives, each time
it is called, the CPU seconds used so far by each group on that path (the node; a proxy; for a
tfscache path, its Python processes and its HAProxy apart). bench_warm reads it before and after
each timed window. Also what a haproxy data plane's HAProxy says it routed (its stick table)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil

Meter = Callable[[], dict[str, float]]


def _seconds(processes) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (a node, a naive hop, nginx's master and workers)."""
    return _seconds(_tree(pid))


def serve_cpu(pid: int, node_pid: int | None = None) -> dict[str, float]:
    """CPU seconds of a ``tfscache serve`` tree in two groups: ``haproxy`` (its HAProxy master and
    workers) and ``tfscache python`` (the serve process and every other descendant: a worker
    front end, a control process), never the node ``node_pid`` nor anything below it (an embedded
    serve's tritonserver). Processes that ended within the window are not counted."""
    tree = _tree(pid)
    left_out: set[int] = set()
    haproxy: list[psutil.Process] = []
    for p in tree:
        try:
            if p.pid == node_pid:
                left_out |= {q.pid for q in _tree(p.pid)}
            elif p.name() == "haproxy":
                group = _tree(p.pid)
                haproxy += [q for q in group if q.pid not in {h.pid for h in haproxy}]
        except psutil.NoSuchProcess:
            continue
    left_out |= {p.pid for p in haproxy}
    return {"tfscache python": _seconds([p for p in tree if p.pid not in left_out]),
            "haproxy": _seconds(haproxy)}


def haproxy_routed(state_dir: Path) -> dict[str, int]:
    """Requests a ``--data-plane haproxy`` serve's HAProxy routed, by ``MODEL@NODE`` (its stick table
    ``inflight``); {} where its runtime socket does not answer."""
    from tfscache.dataplane import config

    routed: dict[str, int] = {}
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(config.runtime_socket_for(Path(state_dir) / "dataplane")))
            sock.sendall(b"show table inflight\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return routed
    for line in answer.decode().splitlines():
        if "key=" in line and "http_req_cnt=" in line:
            key = line.split("key=", 1)[1].split()[0]
            routed[key] = int(line.rsplit("http_req_cnt=", 1)[1].split()[0])
    return routed


def wait_routed(target: str, method: str, requests: dict[str, bytes], state_dir: Path,
                timeout: float = 15.0) -> bool:
    """Sends each model's request through a haproxy data plane until HAProxy counts one as routed
    (the control plane grants a route within a poll or two of a model becoming resident): False if
    one is still not routed after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for name, request in requests.items():
            while True:
                before = haproxy_routed(state_dir)
                call(request, timeout=60)
                after = haproxy_routed(state_dir)
                if any(k.startswith(f"{name}@") and v > before.get(k, 0) for k, v in after.items()):
                    break
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
    return True


def serve_meter(pid: int, node_pid: int, serve_node_pid: int | None = None,
                state_dir: Path | None = None) -> Meter:
    """A tfscache path's meter: its Python processes, its HAProxy, the node (``node_pid``'s tree); with
    ``state_dir`` (a haproxy data plane) also ``routed``, HAProxy's count of requests it routed."""
    def meter() -> dict[str, float]:
        used = {**serve_cpu(pid, serve_node_pid), "node": tree_cpu(node_pid)}
        if state_dir is None:
            del used["haproxy"]  # the Python data plane has none
        else:
            used["routed"] = float(sum(haproxy_routed(state_dir).values()))
        return used
    return meter


def proxy_meter(label: str, pid: int | None, node_pid: int) -> Meter:
    """The meter of direct (``pid`` None: the node only) or of a proxy in its own process tree."""
    if pid is None:
        return lambda: {"node": tree_cpu(node_pid)}
    return lambda: {label: tree_cpu(pid), "node": tree_cpu(node_pid)}
