"""tfscache.kinds.gpumem: the NVML reader over a scripted pynvml, the node's process tree, growth across a load."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tfscache.cache.planner import share_growth
from tfscache.kinds.gpumem import NodeGpuMemory, NvmlReader, ScriptedReader, gpu_cap, process_tree

GiB = 1 << 30


class FakeNvml:
    """The part of pynvml (nvidia-ml-py) the reader calls, scripted: ``devices`` lists each GPU's processes."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: list[list[tuple[int, int | None]]], init_error: str = "") -> None:
        self.devices, self.init_error = devices, init_error
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.devices[handle]]


def test_used_by_sums_the_processes_over_every_gpu():
    nvml = FakeNvml([[(10, 2 * GiB), (11, 1 * GiB), (99, 5 * GiB)], [(10, 3 * GiB), (12, None)]])
    reader = NvmlReader(nvml)
    assert reader.available() and reader.reason == ""
    assert reader.used_by({10, 11, 12}) == 6 * GiB  # 99 is another process; 12's use is hidden (None)
    assert reader.used_by({42}) == 0
    nvml.devices[0].append((11, 4 * GiB))  # read anew each time
    assert reader.used_by({11}) == 5 * GiB
    assert nvml.calls == ["init"]  # started once
    reader.close()
    assert nvml.calls == ["init", "shutdown"]


def test_an_nvml_error_while_reading_is_none():
    nvml = FakeNvml([[(10, GiB)]])

    def broken(handle):
        raise nvml.NVMLError("GPU is lost")

    nvml.nvmlDeviceGetComputeRunningProcesses = broken
    assert NvmlReader(nvml).used_by({10}) is None


@pytest.mark.parametrize("nvml, why", [
    (FakeNvml([], init_error="Driver Not Loaded"), "NVML cannot start (Driver Not Loaded): no NVIDIA driver or GPU here"),
    (FakeNvml([]), "NVML sees no GPU"),
])
def test_without_a_gpu_the_reader_is_off_and_says_why(nvml, why):
    reader = NvmlReader(nvml)
    assert not reader.available() and reader.used_by({1}) is None
    assert reader.reason == why
    assert gpu_cap(8 * GiB, reader) == (0, f"GPU memory cap off: {why}; cache.gpu_memory_per_node = {8 * GiB} "
                                           "is ignored")


def test_without_nvidia_ml_py_the_reader_is_off(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    reader = NvmlReader()
    assert not reader.available()
    assert reader.reason == "nvidia-ml-py is not installed (pip install 'tfscache[gpu]')"


def test_the_real_reader_on_this_machine():
    reader = NvmlReader()
    if reader.available():  # a machine with a GPU: scripts/check_gpu_memory.py checks it there
        assert reader.used_by({os.getpid()}) is not None
        reader.close()
    else:
        assert reader.reason and gpu_cap(GiB, reader)[0] == 0


def test_the_cap_in_force_and_the_start_up_line():
    assert gpu_cap(0, ScriptedReader()) == (0, "GPU memory cap off (cache.gpu_memory_per_node = 0)")
    assert gpu_cap(GiB, ScriptedReader()) == (GiB, f"GPU memory cap: {GiB} bytes of models per node, "
                                                   "measured with NVML")
    assert gpu_cap(GiB, ScriptedReader(available=False))[0] == 0


def test_the_node_is_its_process_tree():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        tree = process_tree(os.getpid())
        assert {os.getpid(), child.pid} <= tree
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert process_tree(child.pid) == set()  # gone


def test_a_models_gpu_size_is_the_growth_across_its_load():
    reader = ScriptedReader({100: 1 * GiB, 101: 0, 7: 9 * GiB})  # the node (100) and its backend (101)
    pid = {"now": 100}
    node = NodeGpuMemory(reader, lambda: pid["now"], tree=lambda p: {p, p + 1})
    before = node.used()
    reader.usage[101] = 3 * GiB  # the load allocated on the GPU in the backend process
    after = node.used()
    assert (before, after) == (1 * GiB, 4 * GiB)  # process 7 is not the node's
    assert reader.reads == [frozenset({100, 101})] * 2
    assert share_growth({("a", 1): 300, ("b", 1): 100}, before, after) == {("a", 1): 9 * GiB // 4,
                                                                          ("b", 1): 3 * GiB // 4}
    pid["now"] = None  # the node is gone: unknown, not 0
    assert node.used() is None
    assert NodeGpuMemory(ScriptedReader(available=False), lambda: 100).used() is None


@pytest.mark.parametrize("weights, before, after, shared", [
    ({"a": 0, "b": 0}, 0, 10, {"a": 5, "b": 5}),  # no host sizes yet: equal shares
    ({"a": 1}, 10, 4, {"a": 0}),  # the GPU shrank across the load (a cache freed): not negative
    ({"a": 1}, None, 4, {}),  # not measured
    ({}, 0, 4, {}),
])
def test_share_growth(weights, before, after, shared):
    assert share_growth(weights, before, after) == shared


def test_the_check_script_says_when_this_machine_has_no_gpu():
    if NvmlReader().available():
        pytest.skip("a GPU is here: run scripts/check_gpu_memory.py itself")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_gpu_memory.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("check_gpu_memory: cannot check here: no GPU to check: ")
