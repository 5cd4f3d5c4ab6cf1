"""How an MLServer node is started and checked before start-up (no MLServer process needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfscache.kinds.mlserver import launcher
from tfscache.kinds.table import KINDS
from tfscache.settings import Settings, SettingsError


def test_the_command_starts_mlserver_with_nothing_loaded_on_chosen_local_ports(tmp_path):
    argv, env = launcher.command(Path("/opt/ml/bin/mlserver"), tmp_path / "repo", http_port=1001, grpc_port=1002,
                                 metrics_port=1003, metrics_dir=tmp_path / "m",
                                 extra=["MLSERVER_PARALLEL_WORKERS=2", "MLSERVER_HOST=127.0.0.2"])
    assert argv == ["/opt/ml/bin/mlserver", "start", str(tmp_path / "repo")]
    assert {k: v for k, v in env.items() if k.startswith("MLSERVER_")} == {
        "MLSERVER_LOAD_MODELS_AT_STARTUP": "false", "MLSERVER_HOST": "127.0.0.2",  # extra comes last
        "MLSERVER_HTTP_PORT": "1001", "MLSERVER_GRPC_PORT": "1002", "MLSERVER_METRICS_PORT": "1003",
        "MLSERVER_METRICS_DIR": str(tmp_path / "m"), "MLSERVER_PARALLEL_WORKERS": "2"}


@pytest.mark.parametrize("bad", ["--http-port=1", "PARALLEL_WORKERS=2", "MLSERVER_X", "MLSERVER_A-B=1"])
def test_extra_args_must_be_mlserver_settings(bad):
    with pytest.raises(ValueError, match="MLSERVER_NAME=VALUE"):
        launcher.settings_env([bad])


def test_the_program_comes_from_node_command_or_path(tmp_path, monkeypatch):
    program = tmp_path / "bin" / "mlserver"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert launcher.find_mlserver(str(program)) == program
    monkeypatch.setenv("PATH", str(program.parent))
    assert launcher.find_mlserver() == program
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(launcher.MLServerNotFound, match="install_mlserver|pip install mlserver"):
        launcher.find_mlserver()
    with pytest.raises(launcher.MLServerNotFound, match="no such program"):
        launcher.find_mlserver(str(tmp_path / "nowhere" / "mlserver"))


def test_preflight_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    kind = KINDS["mlserver"]
    settings = Settings()
    settings.node.backend = "mlserver"
    with pytest.raises(SettingsError, match="node.backend = mlserver .*mlserver not found on PATH"):
        kind.part("preflight")(settings, kind)
    program = tmp_path / "mlserver"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    kind.part("preflight")(settings, kind)  # found on PATH: nothing to say
    settings.node.extra_args = ["--debug"]
    with pytest.raises(SettingsError, match="node.extra_args"):
        kind.part("preflight")(settings, kind)
