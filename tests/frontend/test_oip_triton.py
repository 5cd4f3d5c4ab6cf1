"""End to end: tritonclient (gRPC and REST) -> the Open Inference Protocol front end -> Router ->
NodeBackend (a CacheManager with the Triton adapter) -> a real tritonserver.

What each answer says is checked against Triton's own index (RepositoryIndex), never the
front end's word: ModelReady loads nothing, ModelInfer loads, unknown models get Triton's
own texts. Built in-process as test_router.py builds its world (``tfscache serve --backend
triton`` wires the same pieces).
"""

from __future__ import annotations

import asyncio
import aiohttp
import numpy as np
import pytest
import tritonclient.grpc.aio as tritongrpc
import tritonclient.http.aio as tritonhttp
from tritonclient.utils import InferenceServerException

from support.triton import start_triton
from tfscache.cache.manager import CacheManager
from tfscache.kinds.triton.adapter import TritonAdapter
from tfscache.frontend.backends import NodeBackend
from tfscache.frontend.grpc_server import GrpcFrontend
from tfscache.frontend.protocols.oip import PROTOCOL
from tfscache.frontend.protocols.oip.methods import REPOSITORY_REFUSED
from tfscache.frontend.rest import RestFrontend
from tfscache.frontend.router import Router
from tfscache.frontend.upstream import Upstream
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.triton.client import READY, OipClient
from tfscache.repository.local import ModelRepository
from tfscache.cluster.ring import Ring
from tfscache.settings import CacheSection
from support.models.triton import build_triton_models

LIMIT = 1 << 26


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("oip-repo")
    build_triton_models(root, synthetic=2)
    return root


@pytest.fixture(scope="module")
def triton(tmp_path_factory, triton_repo):
    with start_triton(tmp_path_factory.mktemp("oip-triton"), triton_repo) as process:
        yield process


@pytest.fixture
async def world(triton, triton_repo):
    oip = OipClient(triton.grpc_target, rpc_deadline_s=10.0)
    repository = ModelRepository(triton_repo, rescan_s=0.0)
    adapter = TritonAdapter(oip, repository, rpc_deadline_s=10.0, memory=NodeMemory(triton.pid))
    cache = CacheManager(adapter, repository, CacheSection(max_models_per_node=1, room_timeout_s=60.0,
                                                       reload_deadline_s=60.0))
    await cache.start()
    await cache.wait_synced(60)  # nothing another test left loaded
    http = aiohttp.ClientSession()
    backend = NodeBackend("t", Upstream(triton.grpc_target, triton.http_target, http, max_send_bytes=LIMIT,
                                        max_receive_bytes=LIMIT), cache)
    router = Router(Ring({"t": backend}, replicas=1), {"t": backend}, repository=repository)
    grpc_front = GrpcFrontend(router, bind_address="127.0.0.1", port=0, max_send_bytes=LIMIT,
                              max_receive_bytes=LIMIT, protocol=PROTOCOL)
    rest_front = RestFrontend(router, bind_address="127.0.0.1", port=0, max_receive_bytes=LIMIT, timeout_s=60,
                              protocol=PROTOCOL)
    grpc_port, rest_port = await grpc_front.start(), await rest_front.start()
    grpc_client = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    rest_client = tritonhttp.InferenceServerClient(f"127.0.0.1:{rest_port}")
    yield {"grpc": grpc_client, "rest": rest_client, "oip": oip, "cache": cache}
    await rest_client.close()
    await grpc_client.close()
    await rest_front.stop()
    await grpc_front.stop(0)
    await cache.stop()
    await adapter.close()
    await router.close()
    await http.close()
    await oip.close()


async def resident(oip: OipClient) -> set[str]:
    """The models Triton itself says are READY."""
    return {e.name for e in await oip.index(ready=True)}


def addk_inputs(module, x: list[float], binary: bool = True):
    tensor = module.InferInput("x", [len(x)], "FP32")
    if module is tritonhttp:
        tensor.set_data_from_numpy(np.array(x, dtype=np.float32), binary_data=binary)
        return [tensor], [module.InferRequestedOutput("y", binary_data=binary)]
    tensor.set_data_from_numpy(np.array(x, dtype=np.float32))
    return [tensor], [module.InferRequestedOutput("y")]


async def test_grpc_probes_load_nothing_and_infer_loads(world):
    client, oip = world["grpc"], world["oip"]
    assert await client.is_server_live() and await client.is_server_ready()
    assert (await client.get_server_metadata()).name == "triton"
    assert await client.is_model_ready("addk_1") is True  # on disk: a request would load it
    assert await resident(oip) == set()
    inputs, outputs = addk_inputs(tritongrpc, [0.5, 2.0])
    result = await client.infer("addk_1", inputs, outputs=outputs)
    assert result.as_numpy("y").tolist() == [1.5, 3.0]
    assert await resident(oip) == {"addk_1"}
    assert await client.is_model_ready("addk_1", "1") is True  # resident: Triton's own answer
    assert (await client.get_model_metadata("addk_1")).name == "addk_1"
    assert (await client.get_model_config("addk_1")).config.backend == "python"
    # Triton counts a request once its response is released, which may be just after the client
    # has it: poll the count itself (a deadline, no fixed sleep) before asserting it.
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        stats = await client.get_inference_statistics("addk_1")
        success = stats.model_stats[0].inference_stats.success.count
        if success >= 1 or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.02)
    assert success >= 1
    assert await client.is_model_ready("addk_2") is True
    assert await resident(oip) == {"addk_1"}  # the probe evicted nothing


async def test_grpc_errors_are_tritons(world):
    client = world["grpc"]
    inputs, outputs = addk_inputs(tritongrpc, [1.0])
    with pytest.raises(InferenceServerException) as info:
        await client.infer("ghost", inputs, outputs=outputs)
    assert (info.value.status(), info.value.message()) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'ghost' is not found")
    with pytest.raises(InferenceServerException) as info:
        await client.infer("addk_1", inputs, model_version="v1", outputs=outputs)
    assert (info.value.status(), info.value.message()) == (
        "StatusCode.INVALID_ARGUMENT", "failed to get model version from specified version string 'v1' "
                                       "(details: stol), version should be an integral value > 0")
    with pytest.raises(InferenceServerException) as info:
        await client.load_model("addk_1")
    assert (info.value.status(), info.value.message()) == ("StatusCode.FAILED_PRECONDITION", REPOSITORY_REFUSED)
    assert await client.is_model_ready("ghost") is False  # Triton 2.51's own answer for an unknown model
    assert await resident(world["oip"]) == set()


async def test_rest_binary_infer_and_ready(world):
    client, oip = world["rest"], world["oip"]
    assert await client.is_server_live() and await client.is_server_ready()
    assert await client.is_model_ready("addk_2") is True
    assert await resident(oip) == set()
    for binary in (True, False):  # the binary tensor extension, and plain JSON
        inputs, outputs = addk_inputs(tritonhttp, [1.0, -2.0], binary=binary)
        result = await client.infer("addk_2", inputs, outputs=outputs, model_version="1")
        assert result.as_numpy("y").tolist() == [3.0, 0.0]
    assert await resident(oip) == {"addk_2"}
    assert (await client.get_model_metadata("addk_2"))["name"] == "addk_2"
    with pytest.raises(InferenceServerException) as info:
        await client.get_model_config("ghost")
    assert (info.value.status(), info.value.message()) == ("404", "Request for unknown model: 'ghost' is not found")
    assert await client.is_model_ready("ghost") is False
    assert [e.state for e in await oip.index() if e.name == "addk_2"] == [READY]
