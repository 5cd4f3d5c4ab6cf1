"""`tfscache serve --data-plane haproxy`: the start-up check of the haproxy binary (exit 2)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tfscache.dataplane import binary


def _serve(tmp_path, *flags):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(
        [sys.executable, "-m", "tfscache", "serve", "--grpc-port", "0", "--rest-port", "0",
         "--model-repository", str(tmp_path), *flags],
        capture_output=True, text=True, timeout=60, env=env)


def _fake_haproxy(tmp_path, version: str) -> str:
    path = tmp_path / "haproxy"
    path.write_text(f"#!/bin/sh\necho 'HAProxy version {version} 2026/10/17'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("text, want", [
    ("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/", (2, 6)),
    ("HA-Proxy version 1.8.19 2019/02/11", (1, 8)),
    ("haproxy: not a version", None),
])
def test_parse_version(text, want):
    assert binary.parse_version(text) == want


def test_missing_binary_exits_2_with_one_line(tmp_path):
    done = _serve(tmp_path, "--data-plane", "haproxy", "--config", _config(tmp_path, "nope-x"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install haproxy" in lines[0], done.stderr


def test_too_old_binary_exits_2(tmp_path):
    old = _fake_haproxy(tmp_path, "2.4.22")
    done = _serve(tmp_path, "--data-plane", "haproxy", "--config", _config(tmp_path, old))
    assert done.returncode == 2
    assert "haproxy >= 2.6" in done.stderr and "is 2.4" in done.stderr, done.stderr


def test_check_accepts_new_enough(tmp_path):
    assert binary.check(_fake_haproxy(tmp_path, "2.8.3")) == (2, 8)


def test_bad_data_plane_value_exits_2(tmp_path):
    done = _serve(tmp_path, "--data-plane", "nginx")
    assert done.returncode == 2
    assert "python or haproxy" in done.stderr, done.stderr


def _config(tmp_path, haproxy_binary: str) -> str:
    path = tmp_path / "tfscache.toml"
    path.write_text(f'[server]\nhaproxy_binary = "{haproxy_binary}"\n')
    return str(path)


def test_a_haproxy_that_cannot_serve_fails_start_up_naming_its_log(tmp_path):
    new = _fake_haproxy(tmp_path, "2.8.3")  # new enough, but it exits at once
    done = _serve(tmp_path, "--data-plane", "haproxy", "--config", _config(tmp_path, new))
    assert done.returncode == 1
    assert "haproxy exited with 0 while starting" in done.stderr
    assert "haproxy.log" in done.stderr
