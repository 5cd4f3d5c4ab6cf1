"""GPU memory of a node's process tree, read through NVML: what the GPU cap measures (docs/gpu.md).

``cache.gpu_memory_per_node`` (``--gpu-memory-per-node``) caps the GPU bytes of the models
on one node, as ``memory_per_node`` caps their host bytes. A model's GPU size is learned
from the growth of its node's GPU memory across its load (``tfscache.cache.planner.share_growth``), and the
planner counts it against ``Caps.gpu_bytes`` (tfscache.cache.planner).

* ``GpuReader`` is the protocol: ``available()`` and ``used_by(pids)``, the bytes that the
  processes ``pids`` hold on every GPU (``None`` when it cannot be read).
* ``NvmlReader`` reads NVML through ``pynvml`` (the ``nvidia-ml-py`` package, extra
  ``tfscache[gpu]``), imported on first use: without it, a driver or a GPU it is not
  ``available()`` and says why (``reason``).
* ``ScriptedReader`` is a reader for tests, driven by the test.
* ``NodeGpuMemory`` reads one node: its process and every descendant (the process tree,
  as TF Serving's or Triton's backends may be children).
* ``gpu_cap(cap, reader)`` is the cap in force and the start-up line that says so: off
  (0) without a GPU, whatever was asked.

NVML reports process ids as the host sees them: in a container the node's process must be
in the same PID namespace as the host's view (``hostPID``) for the ids to match, or every
read is 0 (docs/gpu.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import psutil

log = logging.getLogger("tfscache.kinds.gpumem")


class GpuReader(Protocol):
    """Reads the GPU memory held by processes (blocking calls: run them in a worker thread)."""

    reason: str  # why no GPU can be read ("" while one can)

    def available(self) -> bool:
        """A GPU can be read now."""
        ...

    def used_by(self, pids: Collection[int]) -> int | None:
        """Bytes the processes ``pids`` hold on every GPU; None when it cannot be read."""
        ...


class NvmlReader:
    """A GpuReader over NVML: ``nvmlDeviceGetComputeRunningProcesses`` summed over every device."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml  # the pynvml module; imported on first use when None
        self._lock = threading.Lock()
        self._started: bool | None = None  # None: not tried yet
        self.reason = ""
        """Why NVML cannot be read (empty while it can, or before the first try)."""

    def available(self) -> bool:
        with self._lock:
            if self._started is None:
                self._started = self._start()
            return self._started

    def used_by(self, pids: Collection[int]) -> int | None:
        if not self.available():
            return None
        nvml, wanted = self._nvml, set(pids)
        try:
            total = 0
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    # None where the driver hides it
                    if process.pid in wanted and process.usedGpuMemory:
                        total += int(process.usedGpuMemory)
            return total
        except nvml.NVMLError as exc:
            log.warning("cannot read GPU memory through NVML: %s", exc)
            return None

    def close(self) -> None:
        with self._lock:
            if self._started:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError:
                    pass
            self._started = None

    def _start(self) -> bool:
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - the [gpu] extra, only when a GPU cap is asked for

                self._nvml = pynvml
            except ImportError:
                self.reason = "nvidia-ml-py is not installed (pip install 'tfscache[gpu]')"
                return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.reason = f"NVML cannot start ({exc}): no NVIDIA driver or GPU here"
            return False
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            count, self.reason = 0, f"NVML cannot count GPUs ({exc})"
        if count < 1:
            self.reason = self.reason or "NVML sees no GPU"
            nvml.nvmlShutdown()
            return False
        self.reason = ""
        return True


class ScriptedReader:
    """A GpuReader for tests: ``usage`` maps a pid to the bytes it holds; the test changes it
    between reads."""

    def __init__(self, usage: Mapping[int, int] | None = None, available: bool = True) -> None:
        self.usage: dict[int, int] = dict(usage or {})
        self.present = available
        self.reads: list[frozenset[int]] = []  # the pid sets asked about, in order
        self.reason = "" if available else "scripted: no GPU"

    def available(self) -> bool:
        return self.present

    def used_by(self, pids: Collection[int]) -> int | None:
        self.reads.append(frozenset(pids))
        return sum(self.usage.get(pid, 0) for pid in pids) if self.present else None


def process_tree(pid: int) -> set[int]:
    """``pid`` and every descendant of it that is alive now (empty when ``pid`` is gone)."""
    try:
        process = psutil.Process(pid)
        return {pid, *(child.pid for child in process.children(recursive=True))}
    except psutil.Error:
        return set()


class NodeGpuMemory:
    """The GPU bytes of one node's process tree; ``pid`` re-read at every call (a node may be replaced)."""

    def __init__(self, reader: GpuReader, pid: Callable[[], int | None],
                 tree: Callable[[int], set[int]] = process_tree) -> None:
        self.reader = reader
        self._pid = pid
        self._tree = tree

    def used(self) -> int | None:
        """Bytes on every GPU held by the node's process tree now; None when unknown (blocking)."""
        pid = self._pid()
        if pid is None or not self.reader.available():
            return None
        pids = self._tree(pid)
        return self.reader.used_by(pids) if pids else None



def gpu_cap(cap: int, reader: GpuReader) -> tuple[int, str]:
    """(the GPU cap in force, the start-up line saying so): 0 unless asked for and a GPU can be read."""
    if not cap:
        return 0, "GPU memory cap off (cache.gpu_memory_per_node = 0)"
    if not reader.available():
        why = reader.reason or "no GPU can be read"
        return 0, f"GPU memory cap off: {why}; cache.gpu_memory_per_node = {cap} is ignored"
    return cap, f"GPU memory cap: {cap} bytes of models per node, measured with NVML"
