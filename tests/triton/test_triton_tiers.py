"""Demotion within a Triton node (cache.demote = host) against a real tritonserver: a GPU victim
is loaded again on KIND_CPU instances and keeps answering; a demoted model whose requests queue
goes back to its own instance groups; no request fails through either.

This machine has no GPU, and a KIND_GPU instance group cannot load without one. The models
stand in for GPU models (support.models.triton.build_gpu_stand_in): their own instance group is
named ``gpu_stand_in``, and each of its instances writes a file saying it holds 1 GiB of "GPU"
memory while it lives. The cache's GPU reading sums those files for the node's live processes
(as NVML sums per process), so it follows what Triton really did with the instances. The move
itself is Triton's: a repository load with a config override that changes only
``instance_group`` (its in-place update path), read back from Triton's own configuration.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc.aio as tritongrpc

from support.models.triton import build_gpu_stand_in
from support.waiting import until
from tfscache.cache.manager import CacheManager
from tfscache.kinds.gpumem import NodeGpuMemory, ScriptedReader, process_tree
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.triton.adapter import TritonAdapter
from tfscache.kinds.triton.client import OipClient
from tfscache.repository.local import ModelRepository
from tfscache.settings import CacheSection

GiB = 1 << 30
MODELS = {"tier_1": 1, "tier_2": 2, "tier_3": 3}  # name -> k (y = x + k)


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu")


@pytest.fixture(scope="module")
def triton_repository(triton_repository, tmp_path_factory, gpu_dir) -> Path:
    """This module's repository: the shared one plus the GPU stand-ins."""
    root = tmp_path_factory.mktemp("tiers_repository")
    shutil.copytree(triton_repository, root, dirs_exist_ok=True)
    for name, k in MODELS.items():
        build_gpu_stand_in(root, k, gpu_dir, GiB, name)
    return root


class StandInGpu(NodeGpuMemory):
    """The node's "GPU" bytes: the stand-in files of its live processes (read in the reloader's
    worker thread, like NVML)."""

    def __init__(self, gpu_dir: Path, pid: int) -> None:
        super().__init__(ScriptedReader(), lambda: pid)
        self.gpu_dir, self.pid = gpu_dir, pid

    def used(self) -> int:
        alive = process_tree(self.pid)
        return sum(int(f.read_text() or 0) for f in self.gpu_dir.iterdir()
                   if int(f.name.rsplit("-", 1)[1]) in alive)

    def holders(self) -> set[str]:
        alive = process_tree(self.pid)
        return {f.name.rsplit("-", 1)[0] for f in self.gpu_dir.iterdir()
                if int(f.name.rsplit("-", 1)[1]) in alive}


def instance_groups(triton, name: str) -> list[dict]:
    """The instance groups Triton serves ``name`` with now (its own configuration API)."""
    reply = requests.get(f"{triton.rest_url}/v2/models/{name}/config", timeout=10)
    reply.raise_for_status()
    return reply.json()["instance_group"]


def tiers(cache) -> dict[str, str]:
    return {m.name: m.tier + (f"->{m.moving}" if m.moving else "") for m in cache.snapshot()}


class Traffic:
    """Clients that call each of ``names`` in a loop, through the official client, and count
    answers and failures, until stopped."""

    def __init__(self, target: str, names: list[str]) -> None:
        self.client = tritongrpc.InferenceServerClient(target)
        self.answers = {name: 0 for name in names}
        self.failures: list[str] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(name)) for name in names]

    async def _loop(self, name: str) -> None:
        tensor = tritongrpc.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        while not self._stop.is_set():
            try:
                result = await self.client.infer(name, [tensor], client_timeout=60)
                assert result.as_numpy("y").tolist() == [1.0 + MODELS[name]]
                self.answers[name] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                self.failures.append(f"{name}: {e!r}")

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.client.close()


async def test_a_gpu_victim_is_demoted_in_place_and_promoted_back_when_requests_queue(
        triton, triton_repository, gpu_dir):
    for stale in gpu_dir.iterdir():
        stale.unlink()
    oip = OipClient(triton.grpc_target, rpc_deadline_s=10.0)
    repository = ModelRepository(triton_repository, rescan_s=0.0)
    adapter = TritonAdapter(oip, repository, rpc_deadline_s=10.0, memory=NodeMemory(triton.pid))
    adapter.enable_demotion(triton.http_target, cpu_instances=1)
    gpu = StandInGpu(gpu_dir, triton.pid)
    cache = CacheManager(adapter, repository,
                         CacheSection(policy="lru", demote="host", reload_deadline_s=60.0),
                         gpu=gpu, gpu_cap=2 * GiB)
    await cache.start()
    await cache.wait_synced(60)
    traffic = None
    try:
        for name in ("tier_1", "tier_2"):  # both fit the GPU (2 of 2 GiB)
            async with await cache.acquire(name):
                pass
        assert gpu.holders() == {"tier_1", "tier_2"}
        traffic = Traffic(triton.grpc_target, ["tier_1", "tier_2"])
        # tier_3's first load measures 1 GiB more than the cap: once its lease ends, the idle
        # victim (tier_1, least recent) is demoted rather than unloaded.
        async with await cache.acquire("tier_3"):
            assert cache.ledger.gpu_used() == 3 * GiB
        await until(lambda: tiers(cache).get("tier_1") == "host", 60, "tier_1 demoted")
        assert tiers(cache) == {"tier_1": "host", "tier_2": "gpu", "tier_3": "gpu"}
        [group] = instance_groups(triton, "tier_1")
        assert (group["kind"], group["count"]) == ("KIND_CPU", 1)
        assert group["name"] != "gpu_stand_in"
        await until(lambda: gpu.holders() == {"tier_2", "tier_3"}, 30, "tier_1's GPU freed")
        assert gpu.used() <= 2 * GiB
        answered = traffic.answers["tier_1"]
        await until(lambda: traffic.answers["tier_1"] > answered, 30, "tier_1 answering on host")

        # Four requests at once on the demoted model (PromoteRule.queue): it goes back to the
        # GPU, and the GPU's idle victim (tier_2) is demoted to make room.
        held = [await cache.acquire("tier_1") for _ in range(4)]
        try:
            await until(lambda: tiers(cache).get("tier_1") == "gpu", 60, "tier_1 promoted")
        finally:
            for lease in held:
                lease.release()
        assert tiers(cache) == {"tier_1": "gpu", "tier_2": "host", "tier_3": "gpu"}
        [group] = instance_groups(triton, "tier_1")
        assert group["name"] == "gpu_stand_in"  # its own configuration again
        await until(lambda: gpu.holders() == {"tier_1", "tier_3"}, 30, "the GPU holding 1 and 3")
        assert gpu.used() <= 2 * GiB
        for name in ("tier_1", "tier_2"):
            answered = traffic.answers[name]
            await until(lambda: traffic.answers[name] > answered, 30, f"{name} answering")
    finally:
        if traffic is not None:
            await traffic.stop()
        await cache.stop()
        await adapter.sync([], 60)
        await oip.close()
    assert traffic.failures == []
