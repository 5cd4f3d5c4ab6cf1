"""The admin API of a real ``tfscache serve`` (one ``tfscache node`` child, cap of one model).

Token errors, unknown models and nodes, preload, evict, pin under eviction pressure,
health, and the ``tfscache models|pin|unpin|preload|evict|drain`` commands end to end.
"""

from __future__ import annotations

import json
import subprocess

import grpc
from grpc_health.v1 import health_pb2
import pytest

from support.admin import health_check, predict, start_admin_serve
from support import fixtures
from support.node import PYTHON, REPO, version_status_at
from tfscache.admin.client import AdminClient, AdminError

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def serve(admin_repo, tmp_path_factory):
    with start_admin_serve(tmp_path_factory.mktemp("admin-api"), admin_repo, "--local-nodes", "1",
                           "--max-models-per-node", "1", "--set", "cache.room_timeout_s=1",
                           "--set", "server.grace_s=1", token=TOKEN) as process:
        yield process


channel = fixtures.channel_to("serve")


@pytest.fixture
def admin(serve):
    """A client with the token; every test starts and ends with nothing pinned or resident."""
    with AdminClient(serve.admin_target, token=TOKEN) as client:
        _clear(client)
        yield client
        _clear(client)


def _clear(client: AdminClient) -> None:
    for node in client.list_models().nodes:
        for m in node.models:
            if m.pinned:
                client.unpin(m.name, m.version, node.node)
            client.evict(m.name, m.version, node.node)


def resident(client: AdminClient) -> list[tuple[str, int, str, bool]]:
    return [(m.name, m.version, m.state, m.pinned) for n in client.list_models().nodes for m in n.models]


def node_state(serve, name: str) -> int | None:
    """The node's own GetModelStatus state of version 1 (None: unknown to the node)."""
    statuses = version_status_at(f"127.0.0.1:{serve.node_ports('node0')['grpc']}", name)
    return next((s.state for s in statuses if s.version == 1), None)


def expect(code: grpc.StatusCode, message: str, call, *args, **kwargs) -> None:
    with pytest.raises(AdminError) as info:
        call(*args, **kwargs)
    assert (info.value.code, info.value.message) == (code, message)


# -- tokens ------------------------------------------------------------------------------


def test_a_token_is_required_and_checked(serve, admin):
    with AdminClient(serve.admin_target) as anonymous:
        expect(grpc.StatusCode.UNAUTHENTICATED,
               "admin token required: send metadata 'authorization: Bearer <token>'", anonymous.list_models)
        expect(grpc.StatusCode.UNAUTHENTICATED,
               "admin token required: send metadata 'authorization: Bearer <token>'", anonymous.evict, "addk_1")
        with pytest.raises(AdminError) as info:
            list(anonymous.drain())
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    with AdminClient(serve.admin_target, token="wrong") as wrong:
        expect(grpc.StatusCode.UNAUTHENTICATED, "invalid admin token", wrong.list_models)
        expect(grpc.StatusCode.UNAUTHENTICATED, "invalid admin token", wrong.preload, "addk_1")
    assert [n.node for n in admin.list_models().nodes] == ["node0"]
    assert resident(admin) == []  # nothing was loaded by the refused calls


# -- errors as the cache gives them -------------------------------------------------------


def test_unknown_models_versions_names_and_nodes(admin):
    expect(grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)", admin.preload, "nope")
    expect(grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(addk_1, 9)",
           admin.preload, "addk_1", 9)
    expect(grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)", admin.pin, "nope")
    expect(grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)", admin.evict, "nope")
    expect(grpc.StatusCode.NOT_FOUND, "model addk_2 is not resident on any node of this tfscache",
           admin.evict, "addk_2")
    expect(grpc.StatusCode.NOT_FOUND, "model addk_2 is not pinned on any node of this tfscache",
           admin.unpin, "addk_2")
    expect(grpc.StatusCode.INVALID_ARGUMENT, "Invalid model name '..': a model name must not be '.' or '..'",
           admin.preload, "..")
    expect(grpc.StatusCode.NOT_FOUND, "no node 'node7' in this tfscache; its nodes: node0",
           admin.list_models, "node7")
    expect(grpc.StatusCode.NOT_FOUND, "no node 'node7' in this tfscache; its nodes: node0",
           admin.preload, "addk_1", None, "node7")
    assert resident(admin) == []


def test_preload_returns_once_available(serve, admin):
    response = admin.preload("addk_1")
    [result] = response.results
    assert result.node == "node0"
    assert [(m.name, m.version, m.state, m.leases) for m in result.models] == [("addk_1", 1, "available", 0)]
    assert result.models[0].bytes > 0 and result.models[0].last_use > 0
    assert node_state(serve, "addk_1") == 30  # AVAILABLE on the node itself
    assert resident(admin) == [("addk_1", 1, "available", False)]
    admin.preload("addk_1")  # a hit: still one copy
    assert resident(admin) == [("addk_1", 1, "available", False)]


def test_evict_unloads_an_idle_model_now(serve, admin, channel):
    assert predict(channel, "addk_3", 1.0) == [4.0]
    [result] = admin.evict("addk_3").results
    assert [(m.name, m.version, m.state) for m in result.models] == [("addk_3", 1, "unloaded")]
    assert resident(admin) == []
    assert node_state(serve, "addk_3") in (None, 50)  # END, or forgotten by the node


def test_a_pinned_model_survives_eviction_pressure(admin, channel):
    [result] = admin.pin("addk_1").results
    assert [(m.name, m.pinned) for m in result.models] == [("addk_1", True)]
    # Cap 1: addk_2 needs addk_1's room, which the pin keeps; after room_timeout_s, RESOURCE_EXHAUSTED.
    with pytest.raises(grpc.RpcError) as info:
        predict(channel, "addk_2")
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details().startswith("No room on node node0 ")
    assert "max_models=1 reached; held by addk_1 version 1 (0 leases" in info.value.details()
    assert resident(admin) == [("addk_1", 1, "available", True)]
    expect(grpc.StatusCode.FAILED_PRECONDITION,
           "not evicted: model addk_1 version 1 is pinned on node node0 (unpin it first)", admin.evict, "addk_1")
    [result] = admin.unpin("addk_1").results
    assert [(m.name, m.pinned) for m in result.models] == [("addk_1", False)]
    assert predict(channel, "addk_2", 1.0) == [3.0]  # the policy may evict addk_1 again
    assert resident(admin) == [("addk_2", 1, "available", False)]


def test_health_is_serving_for_the_known_services(serve):
    assert health_check(serve.grpc_target) == health_pb2.HealthCheckResponse.SERVING
    assert health_check(serve.grpc_target, "tensorflow.serving.PredictionService") == \
        health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health_check(serve.grpc_target, "no.such.Service")
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "unknown service 'no.such.Service'")


# -- the CLI ------------------------------------------------------------------------------


def tfscache(serve, *args, token=TOKEN) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", *args, "--address", serve.admin_target, "--token", token],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_subcommands_end_to_end(serve, admin):
    run = tfscache(serve, "preload", "addk_3")
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.startswith("loaded addk_3 version 1 on node node0 (") and run.stdout.endswith(
        " bytes, available)\n")
    run = tfscache(serve, "models")
    assert run.returncode == 0
    assert run.stdout.splitlines()[0] == "node node0 (healthy; 1 resident, 0 queued)"
    assert "addk_3" in run.stdout.splitlines()[1] and "leases 0" in run.stdout
    run = tfscache(serve, "models", "--json")
    listing = json.loads(run.stdout)
    assert [(m["name"], m["version"], m["state"]) for m in listing["nodes"][0]["models"]] == [
        ("addk_3", "1", "available")]
    run = tfscache(serve, "pin", "addk_3", "--version", "1")
    assert run.returncode == 0 and run.stdout.startswith("pinned addk_3 version 1 on node node0 (")
    assert "pinned" in tfscache(serve, "models").stdout.splitlines()[1]
    run = tfscache(serve, "evict", "addk_3")
    assert (run.returncode, run.stdout, run.stderr) == (
        1, "", "tfscache evict: FAILED_PRECONDITION: not evicted: model addk_3 version 1 is pinned on node node0 "
               "(unpin it first)\n")
    assert tfscache(serve, "unpin", "addk_3").returncode == 0
    run = tfscache(serve, "evict", "addk_3")
    assert (run.returncode, run.stdout) == (0, "evicted addk_3 version 1 on node node0 ("
                                               f"{listing['nodes'][0]['models'][0]['bytes']} bytes, unloaded)\n")
    assert resident(admin) == []
    run = tfscache(serve, "models", token="wrong")
    assert (run.returncode, run.stderr) == (1, "tfscache models: UNAUTHENTICATED: invalid admin token\n")
    run = tfscache(serve, "drain", "--node", "node0")
    assert (run.returncode, run.stderr) == (1, "tfscache drain: FAILED_PRECONDITION: node node0 is the last node on "
                                               "the ring; drain the whole process instead\n")
    assert health_check(serve.grpc_target) == health_pb2.HealthCheckResponse.SERVING


# -- join -----------------------------------------------------------------------------------


NOT_SIDECAR = ("join: this tfscache is not in sidecar mode (no node.node_address); it has no discovery to join")


def test_join_needs_the_token_and_sidecar_mode(serve, admin):
    with AdminClient(serve.admin_target) as anonymous:
        expect(grpc.StatusCode.UNAUTHENTICATED,
               "admin token required: send metadata 'authorization: Bearer <token>'", anonymous.join)
    with AdminClient(serve.admin_target, token="wrong") as wrong:
        expect(grpc.StatusCode.UNAUTHENTICATED, "invalid admin token", wrong.join)
    expect(grpc.StatusCode.FAILED_PRECONDITION, NOT_SIDECAR, admin.join)  # embedded: nothing to join
    run = tfscache(serve, "join")
    assert (run.returncode, run.stdout, run.stderr) == (1, "", f"tfscache join: FAILED_PRECONDITION: {NOT_SIDECAR}\n")
    run = tfscache(serve, "join", token="")
    assert (run.returncode, run.stderr) == (
        1, "tfscache join: UNAUTHENTICATED: admin token required: send metadata 'authorization: Bearer <token>'\n")
    assert health_check(serve.grpc_target) == health_pb2.HealthCheckResponse.SERVING
