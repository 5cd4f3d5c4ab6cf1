"""The Open Inference Protocol front end (gRPC and REST) over the router, against recording
upstream servers: bytes and headers pass unchanged both ways, ModelReady loads nothing, an
unknown model is worded by a node, the repository API is refused.

As in test_router.py, the nodes are real servers that record what reaches them and the
caches are fakes with CacheManager's interface (here with the versions on disk and the state a
status probe reads); a real tritonserver behind a real cache is test_oip_triton.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import grpc
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2 as triton

from frontend.test_router import FakeCache, RecordingServer
from tfscache import errors
from tfscache.frontend.backends import NodeBackend
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.protocols.oip import PROTOCOL
from tfscache.frontend.protocols.oip.methods import REPOSITORY_REFUSED
from tfscache.frontend.rest import RestFrontend
from tfscache.frontend.router import Router
from tfscache.kinds.triton.adapter import TritonAdapter
from tfscache.frontend.upstream import Upstream
from tfscache.repository.local import not_found
from tfscache.cluster.ring import Ring

SERVICE = "/inference.GRPCInferenceService/"
ON_DISK = {"m": [1, 2], "n": [4]}
NODE_UNKNOWN = "Request for unknown model: 'ghost' is not found"


@dataclass(frozen=True)
class _Found:
    name: str
    version: int


class FakeRepository:
    """ModelRepository.resolve over ``ON_DISK``, with its errors."""

    def resolve(self, name, version=None):
        versions = ON_DISK.get(name, [])
        if version is None and versions:
            return _Found(name, max(versions))
        if version in versions:
            return _Found(name, version)
        raise not_found(name, version)


class ProbeCache(FakeCache):
    """FakeCache plus what a status probe reads: the versions on disk, each version's state,
    failures."""

    lost_texts = TritonAdapter.lost_texts  # the node kind's words for a lost model

    def __init__(self) -> None:
        super().__init__()
        self.repository = FakeRepository()
        self.states: dict[tuple[str, int], str] = {}
        self.failures: dict[tuple[str, int], errors.TfscacheError] = {}

    async def version_on_disk(self, name, version=None):
        return self.repository.resolve(name, version).version

    def state_of(self, name, version):
        return self.states.get((name, version))

    def failure(self, name, version):
        return self.failures.get((name, version))

    async def acquire(self, name, version=None, timeout=None):
        self.repository.resolve(name, version)  # ModelNotFound, as the real cache raises it
        return await super().acquire(name, version, timeout)


class RestRecorder:
    """An HTTP server recording each request and answering ``reply(request, body)``: (status, body, headers)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.reply = lambda request, body: (200, b'{"ok":true}', {"Content-Type": "application/json"})
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        self.port: int | None = None

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.calls.append({"method": request.method, "path": request.raw_path, "body": body,
                           "headers": request.headers.copy()})  # case-insensitive
        status, payload, headers = self.reply(request, body)
        return web.Response(status=status, body=payload, headers=headers)


@pytest.fixture
async def world():
    """Two recording nodes a, b (gRPC and REST), one replica per model, OIP front ends on both transports."""
    grpc_servers = {name: RecordingServer(name) for name in "ab"}
    rest_servers = {name: RestRecorder() for name in "ab"}
    for name in "ab":
        await grpc_servers[name].server.start()
        await rest_servers[name].start()
    http = aiohttp.ClientSession()
    backends = {name: NodeBackend(name, Upstream(f"127.0.0.1:{grpc_servers[name].port}",
                                                 f"127.0.0.1:{rest_servers[name].port}", http,
                                                 max_send_bytes=1 << 26, max_receive_bytes=1 << 26),
                                  ProbeCache())
                for name in "ab"}
    router = Router(Ring(backends, replicas=1), backends)
    frontend = GrpcFrontend(router, bind_address="127.0.0.1", port=0, max_send_bytes=1 << 26,
                            max_receive_bytes=1 << 26, protocol=PROTOCOL)
    rest = RestFrontend(router, bind_address="127.0.0.1", port=0, max_receive_bytes=1 << 26, timeout_s=10,
                        protocol=PROTOCOL)
    port = await frontend.start()
    rest_port = await rest.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    client = aiohttp.ClientSession()
    yield {"grpc": grpc_servers, "rest": rest_servers, "backends": backends, "router": router,
           "call": lambda method, request, **kw: channel.unary_unary(SERVICE + method)(request, timeout=10, **kw),
           "url": f"http://127.0.0.1:{rest_port}", "http": client}
    await client.close()
    await channel.close()
    await rest.stop()
    await frontend.stop(0)
    await router.close()
    await http.close()
    for name in "ab":
        await grpc_servers[name].server.stop(0)
        await rest_servers[name].runner.cleanup()


def owner(world, name: str) -> str:
    return world["router"].ring.replicas_for(name)[0]


def infer_request(name: str, version: str = "") -> bytes:
    request = triton.ModelInferRequest(model_name=name, model_version=version, id="r1")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00\x00\x80\x3f")
    return request.SerializeToString()


def calls(world, node: str) -> list[dict]:
    return world["grpc"][node].calls


# -- gRPC -----------------------------------------------------------------------------------------


async def test_infer_bytes_go_to_the_owner_unchanged_under_a_lease(world):
    node = owner(world, "m")
    request = infer_request("m", "2")
    assert await world["call"]("ModelInfer", request) == f"from-{node}".encode()
    assert calls(world, node) == [{**calls(world, node)[0], "method": SERVICE + "ModelInfer", "request": request}]
    assert world["backends"][node].cache.acquired[0][:2] == ("m", 2)


@pytest.mark.parametrize("method", ["ModelMetadata", "ModelConfig", "ModelStatistics"])
async def test_model_info_takes_a_lease(world, method):
    node = owner(world, "m")
    request = triton.ModelMetadataRequest(name="m").SerializeToString()
    assert await world["call"](method, request) == f"from-{node}".encode()
    assert world["backends"][node].cache.acquired[0][:2] == ("m", None)


async def test_model_ready_for_a_model_on_no_node_loads_nothing(world):
    node = owner(world, "m")
    cache = world["backends"][node].cache
    answer = triton.ModelReadyResponse.FromString(
        await world["call"]("ModelReady", triton.ModelReadyRequest(name="m").SerializeToString()))
    assert answer.ready is True
    cache.failures[("m", 2)] = errors.Internal("load failed")  # its load backs off: not ready
    answer = triton.ModelReadyResponse.FromString(
        await world["call"]("ModelReady", triton.ModelReadyRequest(name="m", version="2").SerializeToString()))
    assert answer.ready is False
    assert not cache.acquired and not calls(world, node)


async def test_model_ready_for_a_resident_model_is_the_nodes_answer_without_a_lease(world):
    node = owner(world, "m")
    cache = world["backends"][node].cache
    cache.states[("m", 2)] = "available"
    world["grpc"][node].reply = lambda request: triton.ModelReadyResponse(ready=True).SerializeToString()
    request = triton.ModelReadyRequest(name="m").SerializeToString()
    assert triton.ModelReadyResponse.FromString(await world["call"]("ModelReady", request)).ready is True
    assert calls(world, node)[0]["request"] == request and not cache.acquired


@pytest.mark.parametrize("method", ["ModelInfer", "ModelReady", "ModelMetadata"])
async def test_an_unknown_model_is_worded_by_a_node(world, method):
    for server in world["grpc"].values():
        server.reply = lambda request: errors.NotFound(NODE_UNKNOWN)
    request = (infer_request("ghost") if method == "ModelInfer"
               else triton.ModelReadyRequest(name="ghost").SerializeToString())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"](method, request)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, NODE_UNKNOWN)
    reached = [c for node in "ab" for c in calls(world, node)]
    assert [c["request"] for c in reached] == [request]  # once, to one node, the bytes unchanged


async def test_an_unknown_model_with_no_node_answering_gets_tritons_text(world):
    for backend in world["backends"].values():
        await backend.upstream.close()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"]("ModelInfer", infer_request("ghost", "3"))
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'ghost' is not found")


async def test_server_requests_go_to_a_node_without_a_lease(world):
    for method, request in (("ServerLive", triton.ServerLiveRequest()), ("ServerReady", triton.ServerReadyRequest())):
        assert (await world["call"](method, request.SerializeToString())).startswith(b"from-")
    for name, server in world["grpc"].items():
        server.reply = lambda request, name=name: triton.ServerMetadataResponse(
            name=f"from-{name}", extensions=["model_repository", "statistics", "trace"]).SerializeToString()
    answer = triton.ServerMetadataResponse.FromString(
        await world["call"]("ServerMetadata", triton.ServerMetadataRequest().SerializeToString()))
    # the node's answer, less the extensions tfscache does not serve
    assert answer.name.startswith("from-") and list(answer.extensions) == ["statistics"]
    assert sum(len(calls(world, node)) for node in "ab") == 3
    assert not any(b.cache.acquired for b in world["backends"].values())


async def test_a_bad_version_is_tritons_invalid_argument_and_reaches_no_node(world):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"]("ModelInfer", infer_request("m", "latest"))
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "failed to get model version from specified version string 'latest' "
                                          "(details: stol), version should be an integral value > 0")
    assert not calls(world, "a") and not calls(world, "b")


@pytest.mark.parametrize("method", ["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"])
async def test_the_repository_api_is_refused(world, method):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"](method, triton.RepositoryModelLoadRequest(model_name="m").SerializeToString())
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, REPOSITORY_REFUSED)


@pytest.mark.parametrize("method", ["SystemSharedMemoryStatus", "LogSettings", "CudaSharedMemoryRegister"])
async def test_other_methods_are_unimplemented(world, method):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"](method, b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_tf_serving_methods_are_not_served_by_the_oip_front_end(world):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await world["call"]("../tensorflow.serving.PredictionService/Predict", b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


# -- REST -----------------------------------------------------------------------------------------


async def test_rest_binary_infer_passes_body_and_headers_both_ways(world):
    node = owner(world, "m")
    header = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}}]}'
    body = header + b"\x00\x00\x80\x3f"
    reply_header = b'{"model_name":"m","outputs":[]}'
    world["rest"][node].reply = lambda request, got: (
        200, reply_header + b"\x01\x02", {"Content-Type": "application/octet-stream",
                                          "Inference-Header-Content-Length": str(len(reply_header))})
    async with world["http"].post(f"{world['url']}/v2/models/m/versions/1/infer?x=1", data=body, headers={
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header)),
            "X-Request-Id": "rid-7"}) as response:
        assert response.status == 200
        assert await response.read() == reply_header + b"\x01\x02"
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["Inference-Header-Content-Length"] == str(len(reply_header))
    call = world["rest"][node].calls[0]
    assert (call["method"], call["path"], call["body"]) == ("POST", "/v2/models/m/versions/1/infer?x=1", body)
    assert call["headers"]["Inference-Header-Content-Length"] == str(len(header))
    assert call["headers"]["Content-Type"] == "application/octet-stream"
    assert call["headers"]["X-Request-Id"] == "rid-7"
    assert world["backends"][node].cache.acquired[0][:2] == ("m", 1)


async def test_rest_errors_from_the_node_pass_through(world):
    node = owner(world, "m")
    world["rest"][node].reply = lambda request, got: (
        400, b'{"error":"unexpected inference input \'z\' for model \'m\'"}', {"Content-Type": "application/json"})
    async with world["http"].post(f"{world['url']}/v2/models/m/infer", data=b"{}") as response:
        assert response.status == 400
        assert await response.json() == {"error": "unexpected inference input 'z' for model 'm'"}


async def test_rest_ready_loads_nothing(world):
    node = owner(world, "n")
    cache = world["backends"][node].cache
    async with world["http"].get(f"{world['url']}/v2/models/n/ready") as response:
        assert (response.status, await response.read()) == (200, b"")
    cache.failures[("n", 4)] = errors.Internal("load failed")
    async with world["http"].get(f"{world['url']}/v2/models/n/versions/4/ready") as response:
        assert response.content_type == "text/plain"  # as Triton 2.51 sends it (docs/triton.md)
        assert (response.status, await response.json(content_type=None)) == (
            400, {"error": "Model version not ready"})
    assert not cache.acquired and not calls(world, node) and not world["rest"][node].calls
    cache.states[("n", 4)] = "available"  # resident: the node's own answer, over gRPC, no lease
    cache.failures.clear()
    world["grpc"][node].reply = lambda request: triton.ModelReadyResponse(ready=False).SerializeToString()
    async with world["http"].get(f"{world['url']}/v2/models/n/ready") as response:
        assert (response.status, await response.json(content_type=None)) == (
            400, {"error": "Model version not ready"})
    assert triton.ModelReadyRequest.FromString(calls(world, node)[0]["request"]) == triton.ModelReadyRequest(name="n")
    assert not cache.acquired


async def test_rest_unknown_model_is_worded_by_a_node(world):
    for server in world["rest"].values():
        server.reply = lambda request, got: (404, b'{"error":"' + NODE_UNKNOWN.encode() + b'"}',
                                             {"Content-Type": "application/json"})
    async with world["http"].get(f"{world['url']}/v2/models/ghost/config") as response:
        assert (response.status, await response.json()) == (404, {"error": NODE_UNKNOWN})
    assert sum(len(s.calls) for s in world["rest"].values()) == 1


async def test_rest_server_urls_go_to_a_node(world):
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/stats"):
        async with world["http"].get(world["url"] + path) as response:
            assert response.status == 200
    assert sorted(c["path"] for s in world["rest"].values() for c in s.calls) == sorted(
        ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/stats"])
    assert not any(b.cache.acquired for b in world["backends"].values())


@pytest.mark.parametrize("method, path, status, error, content_type", [
    ("POST", "/v2/repository/models/m/load", 400, REPOSITORY_REFUSED, "application/json"),
    ("POST", "/v2/repository/index", 400, REPOSITORY_REFUSED, "application/json"),
    ("GET", "/v2/models/m/infer", 405, "Method Not Allowed", "text/plain"),
    ("POST", "/v2/models/m/ready", 405, "Method Not Allowed", "text/plain"),
    ("GET", "/v1/models/m", 404, "Not Found", "text/plain"),
    ("GET", "/v2/models/m/versions/x", 404, "Not Found", "text/plain"),
    ("POST", "/v2/models/m/trace/setting", 501, "trace/setting is not served by tfscache",
     "application/json"),
])
async def test_rest_refusals(world, method, path, status, error, content_type):
    """Each refusal in Triton's body, under the Content-Type Triton 2.51 gives such a URL error."""
    async with world["http"].request(method, world["url"] + path) as response:
        assert response.content_type == content_type
        assert (response.status, await response.json(content_type=None)) == (status, {"error": error})
    assert not any(s.calls for s in world["rest"].values())
