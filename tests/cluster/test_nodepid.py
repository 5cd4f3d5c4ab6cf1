"""tfscache.kinds.nodepid finds the process of a sidecar's node, so the sidecar measures the node's memory."""

from __future__ import annotations

import asyncio
import logging

import psutil
import pytest

from tfscache.kinds.supervisor import free_ports
from support.node import start_node
from tfscache.kinds import nodepid
from tfscache import settings as settings_mod
from tfscache.app import ServeApp

from .conftest import EMPTY, NODE_FLAGS


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A real ``tfscache node`` on a fixed free port, so its command line names the port too."""
    grpc_port, rest_port = free_ports(2)
    with start_node(tmp_path_factory.mktemp("nodepid"), config=EMPTY,
                    flags=[*NODE_FLAGS, f"--port={grpc_port}", f"--rest_api_port={rest_port}"],
                    forked=False) as n:
        yield n


def test_found_by_its_listening_socket(node):
    assert nodepid.listening_pid(node.grpc_port) == node.pid
    assert nodepid.find_node_pid("127.0.0.1", node.grpc_port) == node.pid
    assert nodepid.find_node_pid("localhost", node.grpc_port) == node.pid


def test_found_by_its_command_line_when_sockets_are_not_readable(node, monkeypatch, caplog):
    def denied(kind="inet"):
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", denied)
    with pytest.raises(psutil.AccessDenied):
        nodepid.listening_pid(node.grpc_port)
    with caplog.at_level(logging.INFO, logger="tfscache.kinds.nodepid"):
        assert nodepid.find_node_pid("127.0.0.1", node.grpc_port) == node.pid
    assert "found by its command line (listening sockets not readable)" in caplog.text
    assert nodepid.cmdline_pid(node.rest_port) is None  # --rest_api_port is not --port


def test_not_found_is_none_and_logged_once(node, caplog):
    free = free_ports(1)[0]
    with caplog.at_level(logging.WARNING, logger="tfscache.kinds.nodepid"):
        assert nodepid.find_node_pid("127.0.0.1", free) is None
        assert nodepid.find_node_pid("127.0.0.1", free) is None
        assert nodepid.find_node_pid("192.0.2.1", node.grpc_port) is None  # TEST-NET-1: not this host
        assert nodepid.find_node_pid("192.0.2.1", node.grpc_port) is None
    assert [r.getMessage() for r in caplog.records if r.name == "tfscache.kinds.nodepid"] == [
        f"no process found serving node port {free} on this host (listening socket or "
        f"tensorflow_model_server --port={free}); model sizes stay estimates",
        f"node 192.0.2.1:{node.grpc_port} is not on this host; model sizes stay estimates"]


def test_command_line_forms():
    assert nodepid._is_model_server(["/usr/bin/tensorflow_model_server", "--port=8510"])
    assert nodepid._is_model_server(["/venv/bin/python", "-m", "tfscache", "node", "--port=8510"])
    assert nodepid._is_model_server(["/venv/bin/tfscache", "node", "--port", "8510"])
    assert not nodepid._is_model_server(["/venv/bin/tfscache", "serve", "--port=8510"])
    assert nodepid._port_flag(["x", "--port", "8510"]) == "8510"
    assert nodepid._port_flag(["x", "--port=8510"]) == "8510"
    assert nodepid._port_flag(["x", "--rest_api_port=8511"]) is None


async def test_a_sidecar_measures_its_nodes_memory(node, cluster_repo, tmp_path):
    app = ServeApp(settings_mod.load(env={}, overrides={
        "model_repository": str(cluster_repo), "node.node_address": f"127.0.0.1:{node.grpc_port},{node.rest_port}",
        "ring.self_name": "a", "server.bind_address": "127.0.0.1", "server.grpc_port": 0, "server.rest_port": -1,
        "node.state_dir": str(tmp_path / "state")}))
    await app.start()
    try:
        cache = app.backends["a"].cache
        loaded = await cache.preload("addk_1")
        assert loaded.measured  # the node's RSS growth across the load, not the estimate
    finally:
        await app.stop(grace=0)


async def test_a_sidecar_measures_the_node_that_replaced_its_node(cluster_repo, tmp_path):
    # TF Serving restarted in its container: same ports, a new process. The sidecar finds it
    # again instead of measuring nothing (estimates) until the sidecar itself restarts.
    grpc_port, rest_port = free_ports(2)
    flags = [*NODE_FLAGS, f"--port={grpc_port}", f"--rest_api_port={rest_port}"]
    first = await asyncio.to_thread(start_node, tmp_path / "first", config=EMPTY, flags=flags)
    second = None
    app = ServeApp(settings_mod.load(env={}, overrides={
        "model_repository": str(cluster_repo), "node.node_address": f"127.0.0.1:{grpc_port},{rest_port}",
        "ring.self_name": "a", "server.bind_address": "127.0.0.1", "server.grpc_port": 0, "server.rest_port": -1,
        "node.state_dir": str(tmp_path / "state")}))
    try:
        await app.start()
        cache = app.backends["a"].cache
        assert (await cache.preload("addk_1")).measured and cache.adapter.node_pid == first.pid
        await asyncio.to_thread(first.stop)
        second = await asyncio.to_thread(start_node, tmp_path / "second", config=EMPTY, flags=flags)
        loaded = await cache.preload("addk_2")
        assert loaded.measured and cache.adapter.node_pid == second.pid != first.pid
    finally:
        await app.stop(grace=0)
        first.stop()
        if second is not None:
            second.stop()


def test_node_memory_without_a_process_or_a_way_to_find_one():
    assert nodepid.NodeMemory(None).rss() is None
    finds = []
    memory = nodepid.NodeMemory(None, find=lambda: finds.append(1), retry_s=3600)
    assert memory.rss() is None and memory.rss() is None
    assert finds == [1]  # nothing found: not looked for again within retry_s


def test_which_hosts_are_this_host():
    import socket

    own = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", socket.gethostname(), *own):
        assert nodepid.is_local_host(host), host
    for host in ("192.0.2.1", "no-such-host.invalid"):  # TEST-NET-1; a name that never resolves
        assert not nodepid.is_local_host(host), host
