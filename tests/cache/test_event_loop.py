"""A slow model store never stalls the event loop: repository scans, stats and reads run in threads.

On an NFS or FUSE model store one stat can take a long time; the cache and the front end
share one event loop, so a stat on it would stall all traffic. Here every listing, stat and
labels.json read of the repository takes 200 ms, and the loop must never be blocked for more
than 150 ms while a cache loads, evicts and hits models through it: less than one store call,
so any call made on the loop fails the test, with room for a loaded machine's scheduling.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache import errors
from support.cache import RecordingClient
from tfscache.cache.manager import CacheManager
from tfscache.settings import CacheSection
from tfscache.repository.local import ModelRepository

DELAY_S = 0.2
MAX_LAG_S = 0.15  # < DELAY_S: one store call on the loop is caught


class SlowStore(ModelRepository):
    """A repository on a store where every file-system call takes ``DELAY_S`` (as a slow FUSE mount)."""

    calls = 0

    def _slow(self) -> None:
        SlowStore.calls += 1
        time.sleep(DELAY_S)

    def versions(self, name):
        self._slow()
        return super().versions(name)

    def version_path(self, name, version):
        self._slow()
        return super().version_path(name, version)

    def disk_bytes(self, name, version):
        self._slow()
        return super().disk_bytes(name, version)

    def _read_labels(self, name):
        self._slow()
        return super()._read_labels(name)


class LagMonitor:
    """Ticks every 5 ms and records the longest the loop made a tick wait beyond that."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.monotonic() - before - 0.005)

    def __enter__(self) -> LagMonitor:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc_info) -> None:
        self._task.cancel()


async def test_a_slow_model_store_never_blocks_the_loop(node, repo_root, tmp_path):
    repository = SlowStore(repo_root, rescan_s=0.0)  # every request lists again
    client = RecordingClient(node.grpc_target, rpc_deadline_s=10.0)
    cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(node.pid)), repository,
                         CacheSection(max_models_per_node=2, reload_deadline_s=60.0), state_file=tmp_path / "state.json")
    with LagMonitor() as monitor:
        await cache.start()
        await cache.wait_synced(60)
        for name in ["addk_1", "addk_2", "addk_1", "addk_3", "addk_3", "addk_2"]:  # loads, hits, evictions
            async with await cache.acquire(name):
                assert cache.is_resident(name)
        await repository.refresh_labels("addk_1")  # labels.json, read in a thread
        calls = SlowStore.calls
        with pytest.raises(errors.InvalidArgument, match="Unrecognized servable version label: stable"):
            repository.label_version("addk_1", "stable", max_age=10.0)  # answered from that reading
        assert SlowStore.calls == calls
        await cache.flush_state()
        await cache.stop()
    await client.close()
    assert SlowStore.calls >= 10  # the store was slow many times over
    assert monitor.worst < MAX_LAG_S, f"the event loop was blocked for {monitor.worst * 1000:.0f} ms"
