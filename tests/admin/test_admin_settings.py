"""The admin server's settings: off by default, loopback without a token, a token anywhere else."""

from __future__ import annotations

import subprocess

import pytest

from support.node import PYTHON, REPO
from tfscache import settings as settings_mod

REFUSED = ("bad value for setting server.admin_token: '' (required when server.admin_bind_address is {!r}, "
           "not a loopback address: anyone who can reach it could evict and drain)")


def load(tmp_path, **overrides):
    return settings_mod.load(env={}, overrides={"model_repository": str(tmp_path), **overrides})


def test_defaults_admin_off_and_loopback(tmp_path):
    s = load(tmp_path).server
    assert (s.admin_port, s.admin_bind_address, s.admin_token) == (-1, "127.0.0.1", "")


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::", "tfscache-0.tfscache"])
def test_an_admin_server_off_loopback_needs_a_token(tmp_path, address):
    with pytest.raises(settings_mod.SettingsError) as info:
        load(tmp_path, **{"server.admin_port": 8502, "server.admin_bind_address": address})
    assert str(info.value) == REFUSED.format(address)
    load(tmp_path, **{"server.admin_port": 8502, "server.admin_bind_address": address, "server.admin_token": "t"})
    load(tmp_path, **{"server.admin_port": -1, "server.admin_bind_address": address})  # off: nothing to protect


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_token(tmp_path, address):
    assert load(tmp_path, **{"server.admin_port": 0, "server.admin_bind_address": address}).server.admin_port == 0


def test_serve_refuses_to_start_and_names_the_setting(tmp_path):
    run = subprocess.run([PYTHON, "-m", "tfscache", "serve", "--model-repository", str(tmp_path), "--admin-port", "0",
                          "--set", "server.admin_bind_address=0.0.0.0"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert (run.returncode, run.stderr) == (2, f"tfscache serve: {REFUSED.format('0.0.0.0')}\n")
