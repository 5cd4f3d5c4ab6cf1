"""What one `tfscache serve` holds on its machine: the state directory, the model repository it
loads from, and the GPU memory reader."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from tfscache.cluster.topology import Topology
from tfscache.kinds.table import KINDS
from tfscache.kinds.gpumem import NodeGpuMemory, NvmlReader, gpu_cap
from tfscache.observe.tiermetrics import TierMetrics
from tfscache.repository.local import ModelRepository
from tfscache.repository.opener import open_repository
from tfscache.settings import Settings, remote_url
from tfscache.settings.statedir import StateDirLock, choose, instance_name

log = logging.getLogger("tfscache.app")


class StateDir:
    """``node.state_dir``, else the instance's persistent default, locked while this process runs
    (tfscache.settings.statedir); a temporary one (the default was taken) is removed at release."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.path = Path(settings.node.state_dir) if settings.node.state_dir else None
        self._lock: StateDirLock | None = None
        self._own = False

    def claim(self) -> Path:
        s = self._settings
        instance = (instance_name(node_address=s.node.node_address) if s.sidecar
                    else instance_name(model_repository=s.model_repository))
        self.path, self._lock, self._own = choose(self.path, instance)
        return self.path

    def release(self) -> None:
        if self._own:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.release()


class ModelSource:
    """The model repository: a local directory, or a bucket read through a disk tier under the
    state directory (tfscache.storage), which is opened once that directory is known."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        url = settings.model_repository
        # flat models (docs/mlserver.md), in a directory or a bucket
        self._layout = KINDS[settings.node.backend].repository_layout()
        self.repository = ModelRepository("." if remote_url(url) else url, layout=self._layout)

    async def start(self, state_dir: Path, registry, topology: Topology) -> ModelRepository:
        """Open (a bucket) and start the repository; ``topology``'s caches tell the disk tier
        which versions are in use. ``registry``: the Prometheus registry of its tier metrics."""
        s = self._settings
        if remote_url(s.model_repository):  # a bucket: a disk tier nodes load from
            tier_metrics = TierMetrics(registry)
            self.repository = open_repository(s, state_dir, events=tier_metrics,
                                              layout=self._layout)
            self.repository.set_in_use(lambda key: {b.cache.state_of(*key) for b in topology.nodes()
                                                    if b.cache is not None} - {None})
            tier_metrics.watch(self.repository.tier)
        await self.repository.start()
        return self.repository

    async def stop(self) -> None:
        await self.repository.stop()


class GpuCap:
    """The GPU memory cap in force (``cache.gpu_memory_per_node``; 0: none, or no GPU to measure
    it), read through NVML only when a cap is asked for."""

    def __init__(self, asked: int) -> None:
        self._asked = asked
        self.reader: NvmlReader | None = None
        self.cap = 0

    async def start(self) -> int:
        if self._asked:
            self.reader = NvmlReader()
            self.cap, line = await asyncio.to_thread(gpu_cap, self._asked, self.reader)
            log.log(logging.INFO if self.cap else logging.WARNING, "%s", line)
        return self.cap

    def for_node(self, node_pid) -> NodeGpuMemory | None:
        """What one node's cache measures its GPU memory with (``node_pid()``: its process)."""
        return NodeGpuMemory(self.reader, node_pid) if self.cap else None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
