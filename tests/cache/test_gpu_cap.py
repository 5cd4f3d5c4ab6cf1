"""The GPU cap wired through a live cache: sizes learned from a scripted NVML reader around each load.

This machine has no GPU; the reader is scripted (tfscache.kinds.gpumem.ScriptedReader, keyed by pid),
and the node is a real `tfscache node`. A model's GPU size is the growth of its node's GPU
memory across its load, and the cap then holds as the count and memory caps do.
"""

from __future__ import annotations

from support.cache import RecordingClient
from support.node import version_status_at
from support.waiting import until
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.cache.manager import CacheManager
from tfscache.kinds.gpumem import NodeGpuMemory, ScriptedReader
from tfscache.settings import CacheSection

GiB = 1 << 30


async def test_a_model_s_gpu_size_is_learned_and_the_cap_evicts_for_it(node, repository):
    reader = ScriptedReader({node.pid: 0})
    loads = {"addk_1": 3 * GiB, "addk_2": 3 * GiB, "addk_3": 3 * GiB}

    class Growing(NodeGpuMemory):
        """The node's GPU bytes: each model the node itself holds AVAILABLE takes its share (as a
        CUDA model would). Read in the reloader's worker thread, like NVML."""

        def used(self):
            return sum(size for name, size in loads.items()
                       if any(st.state == 30 for st in version_status_at(node.grpc_target, name)))

    client = RecordingClient(node.grpc_target, rpc_deadline_s=10.0)
    cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(node.pid)), repository,
                         CacheSection(reload_deadline_s=60.0),
                         gpu=Growing(reader, lambda: node.pid), gpu_cap=7 * GiB)
    await cache.start()
    await cache.wait_synced(60)
    # The node is shared: an earlier test's model this cache's first reload dropped may still be
    # unloading (a reload does not wait for unloads). Measured before it ends, a load would see
    # no growth and learn nothing.
    await until(lambda: Growing(reader, lambda: node.pid).used() == 0, 30,
                "the node to hold none of the test's models")
    try:
        for name in ["addk_1", "addk_2", "addk_1", "addk_2"]:  # learn both sizes; both fit (6 of 7 GiB)
            async with await cache.acquire(name):
                pass
        assert {m.name for m in cache.snapshot()} == {"addk_1", "addk_2"}
        assert cache.ledger.gpu_estimate(("addk_1", 1)) == 3 * GiB
        # addk_3 was never loaded: it counts 0 GPU bytes until its load measures 3 GiB, which puts
        # the node over the cap; once its lease ends an idle model goes (the planner's over-cap rule).
        async with await cache.acquire("addk_3"):
            assert cache.ledger.gpu_estimate(("addk_3", 1)) == 3 * GiB
        await until(lambda: cache.ledger.gpu_used() <= 7 * GiB, 30, "the GPU cap to hold again")
        assert {m.name for m in cache.snapshot()} == {"addk_2", "addk_3"}  # addk_1, least recently used, went
        # Now every size is known: a load makes room first, so the cap holds at every instant.
        async with await cache.acquire("addk_1"):
            assert cache.ledger.gpu_used() <= 7 * GiB
        assert {m.name for m in cache.snapshot()} == {"addk_3", "addk_1"}
    finally:
        await cache.stop()
        await client.close()
