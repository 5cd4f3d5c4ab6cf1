"""The Triton node adapter (tfscache.kinds.triton.adapter) against a real tritonserver.

Every result is read back from Triton's own index (RepositoryIndex), never from the
adapter's word. A model that fails in initialize() and one whose initialize() waits on a
file the test controls are written into the server's repository by the tests; Triton's
index lists every directory of it, so the server need not restart.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as tritongrpc

from tfscache import errors
from tfscache.kinds.table import KINDS
from tfscache.cache.manager import CacheManager
from tfscache.kinds.triton.adapter import TritonAdapter
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.triton.client import LOADING, READY, UNLOADING, OipClient
from tfscache.repository.local import ModelRepository
from tfscache.settings import CacheSection
from support.models.triton import build_addk, write_model

from .conftest import PADDING_BYTES

_FAILING_PY = '''\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom in initialize")
'''

# initialize() waits for a file the test creates; finalize() leaves a file behind, so the
# test sees that the instance was unloaded without polling anything.
_HELD_PY = '''\
import os
import time


class TritonPythonModel:
    def initialize(self, args):
        while not os.path.exists({release!r}):
            time.sleep(0.01)

    def execute(self, requests):
        return []

    def finalize(self):
        open({finalized!r}, "w").close()
'''


@pytest.fixture(scope="module")
def triton_repository(triton_repository, tmp_path_factory) -> Path:
    """This module's copy of the shared repository: its tests add broken models to it."""
    root = tmp_path_factory.mktemp("adapter_repository")
    shutil.copytree(triton_repository, root, dirs_exist_ok=True)
    return root


@pytest.fixture
async def oip(triton):
    client = OipClient(triton.grpc_target, rpc_deadline_s=10.0)
    yield client
    await client.close()


@pytest.fixture
async def adapter(triton, triton_repository, oip):
    assert triton.repository == triton_repository  # the module's copy, not the shared one
    adapter = TritonAdapter(oip, ModelRepository(triton_repository, rescan_s=0.0), rpc_deadline_s=10.0,
                            memory=NodeMemory(triton.pid))
    await adapter.sync([], 60)  # nothing another test left loaded
    yield adapter
    await adapter.close()
    await adapter.sync([], 60)


@pytest.fixture
async def infer(triton):
    client = tritongrpc.InferenceServerClient(triton.grpc_target)

    async def run(name: str, x: list[float]) -> np.ndarray:
        tensor = tritongrpc.InferInput("x", [len(x)], "FP32")
        tensor.set_data_from_numpy(np.array(x, dtype=np.float32))
        result = await client.infer(name, [tensor])
        return result.as_numpy("y")

    yield run
    await client.close()


async def states(oip: OipClient, name: str) -> dict[str, tuple[str, str]]:
    """{version: (state, reason)} of ``name`` in Triton's index."""
    return {e.version: (e.state, e.reason) for e in await oip.index() if e.name == name}


async def test_kind_table_names_the_triton_adapter():
    assert KINDS["triton"].part("adapter") is TritonAdapter


async def test_load_two_models_then_infer(adapter, oip, infer):
    keys = [("addk_1", 1), ("addk_2", 1)]
    assert await adapter.load(keys, keys, 60) == {key: None for key in keys}
    ready = {(e.name, e.version) for e in await oip.index(ready=True)}
    assert ready == {("addk_1", "1"), ("addk_2", "1")}
    assert await adapter.available(("addk_1", 1), 10)
    assert not await adapter.available(("addk_1", 2), 10)
    assert not await adapter.available(("addk_3", 1), 10)
    assert (await infer("addk_1", [1.0, 2.0])).tolist() == [2.0, 3.0]
    assert (await infer("addk_2", [1.0, 2.0])).tolist() == [3.0, 4.0]


async def test_unload_returns_once_the_index_says_unloaded(adapter, oip):
    keys = [("addk_1", 1), ("addk_2", 1)]
    await adapter.load(keys, keys, 60)
    await adapter.unload([("addk_1", 1)], [("addk_2", 1)], 30)
    # Triton's unload call returns while the model is UNLOADING (its stub still running);
    # the adapter's returns only once the stub is gone.
    assert await states(oip, "addk_1") == {"1": ("UNAVAILABLE", "unloaded")}
    assert await states(oip, "addk_2") == {"1": ("READY", "")}
    assert not await adapter.available(("addk_1", 1), 10)


async def test_sync_serves_exactly_the_wanted_set(adapter, oip):
    await adapter.load([("addk_1", 1), ("addk_2", 1)], [("addk_1", 1), ("addk_2", 1)], 60)
    await adapter.sync([("addk_2", 1), ("addk_3", 1)], 60)
    assert {e.name for e in await oip.index(ready=True)} == {"addk_2", "addk_3"}
    assert await states(oip, "addk_1") == {"1": ("UNAVAILABLE", "unloaded")}


async def test_failing_initialize_is_an_error_with_tritons_reason(adapter, oip, triton_repository):
    write_model(triton_repository, "initfail", _FAILING_PY, {})
    key = ("initfail", 1)
    error = (await adapter.load([key], [key], 60))[key]
    assert isinstance(error, errors.InvalidArgument)
    assert error.grpc_code.name == "INVALID_ARGUMENT"
    assert error.message.startswith("load failed for model 'initfail': version 1 is at UNAVAILABLE state: "
                                    "Internal: RuntimeError: boom in initialize")
    state, reason = (await states(oip, "initfail"))["1"]
    assert (state, reason.splitlines()[0]) == ("UNAVAILABLE", "Internal: RuntimeError: boom in initialize")
    assert not await adapter.available(key, 10)


async def test_a_model_not_in_the_nodes_repository_is_not_found(triton, oip, tmp_path):
    # The cache's repository has it; the node's does not: Triton answers INTERNAL "failed to
    # poll", and the index (no such directory) makes it NOT_FOUND, Triton's text kept.
    build_addk(tmp_path, 1, name="ghost")
    adapter = TritonAdapter(oip, ModelRepository(tmp_path, rescan_s=0.0))
    error = (await adapter.load([("ghost", 1)], [("ghost", 1)], 30))[("ghost", 1)]
    assert isinstance(error, errors.ModelNotFound)
    assert error.message == ("failed to load 'ghost', failed to poll from model repository (model ghost "
                             f"version 1 is not in the repository of node {triton.grpc_target})")


async def test_a_version_not_on_disk_is_not_found_without_a_load(adapter, oip):
    error = (await adapter.load([("addk_1", 7)], [("addk_1", 7)], 30))[("addk_1", 7)]
    assert isinstance(error, errors.ModelNotFound)
    # the repository's neutral words: the OIP front ends word it for their clients
    assert error.message == "version 7 of model addk_1 is not in the model repository"
    assert not await oip.index(ready=True)


async def test_a_held_load_fails_at_the_deadline_and_is_unloaded_once_it_ends(adapter, oip, triton_repository,
                                                                                tmp_path):
    release, finalized = tmp_path / "release", tmp_path / "finalized"
    write_model(triton_repository, "held", _HELD_PY.format(release=str(release), finalized=str(finalized)), {})
    key = ("held", 1)
    error = (await adapter.load([key], [key], 1.0))[key]
    assert isinstance(error, errors.DeadlineExceeded)
    assert error.message == ("model held version 1 did not load on node "
                             f"{adapter.target} within 1.0 s; Triton cannot cancel a load: it is unloaded "
                             "once it ends")
    assert (await states(oip, "held"))["1"][0] == LOADING  # Triton goes on loading it
    # The model is suspect: a new load of it waits for the abandoned one, within its own deadline.
    again = (await adapter.load([key], [key], 0.5))[key]
    assert isinstance(again, errors.DeadlineExceeded)
    assert again.message == (f"model held: an earlier load or unload of it on node {adapter.target} did not "
                             "end within 0.5 s (a load that passed its deadline)")
    release.touch()
    # Its turn comes once the abandoned load ended and was unloaded (finalize ran); then it loads.
    assert await adapter.load([key], [key], 60) == {key: None}
    assert finalized.exists()
    assert (await states(oip, "held"))["1"] == (READY, "")


async def test_memory_counts_the_stub_processes(adapter):
    key = ("addk_pad", 1)  # holds PADDING_BYTES in its stub process while loaded
    before = await asyncio.to_thread(adapter.memory)
    assert await adapter.load([key], [key], 60) == {key: None}
    loaded = await asyncio.to_thread(adapter.memory)
    assert loaded - before >= PADDING_BYTES
    await adapter.unload([key], [], 30)
    assert await asyncio.to_thread(adapter.memory) < loaded - PADDING_BYTES
    assert not await asyncio.to_thread(adapter.restarted)


async def test_cache_caps_hold_in_tritons_index(adapter, oip, triton_repository, infer):
    cache = CacheManager(adapter, ModelRepository(triton_repository, rescan_s=0.0),
                         CacheSection(max_models_per_node=2, room_timeout_s=60.0, reload_deadline_s=60.0))
    await cache.start()
    await cache.wait_synced(60)
    stop = asyncio.Event()
    peaks: list[int] = []

    async def sample() -> None:
        """Models holding memory on the node (READY, LOADING or UNLOADING), as Triton says."""
        while not stop.is_set():
            index = await oip.index()
            peaks.append(len({e.name for e in index if e.state in (READY, LOADING, UNLOADING)}))
            try:
                await asyncio.wait_for(stop.wait(), 0.005)  # the sampling interval
            except TimeoutError:
                pass

    sampler = asyncio.create_task(sample())
    try:
        for k in [1, 2, 3, 4, 1, 3, 2, 4]:
            async with await cache.acquire(f"addk_{k}", timeout=60) as lease:
                assert (lease.name, lease.version) == (f"addk_{k}", 1)
                assert (await infer(f"addk_{k}", [0.5])).tolist() == [0.5 + k]
    finally:
        stop.set()
        await sampler
        await cache.stop()
    assert max(peaks) == 2
    assert len(peaks) > 20
    assert len(await oip.index(ready=True)) == 2
