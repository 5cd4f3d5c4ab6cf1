"""The default state directory (XDG, FHS for root without a home), instance names, the lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfscache.settings import statedir
from tfscache.settings.statedir import claim, default_state_dir, instance_name, state_home


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A clean environment: no XDG_STATE_HOME, HOME at a fresh directory, not root."""
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setattr(statedir.os, "geteuid", lambda: 1000)
    return monkeypatch


def test_xdg_state_home_wins(env, tmp_path):
    env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir("sidecar-h-1") == tmp_path / "xdg" / "tfscache" / "sidecar-h-1"


@pytest.mark.parametrize("value", ["", "relative/state"])
def test_empty_or_relative_xdg_state_home_is_ignored(env, tmp_path, value):
    env.setenv("XDG_STATE_HOME", value)  # the spec: a relative path is invalid
    assert state_home() == tmp_path / "home" / ".local" / "state"


def test_default_is_under_home(env, tmp_path):
    assert default_state_dir("embedded-0123abcd") == tmp_path / "home/.local/state/tfscache/embedded-0123abcd"
    assert not (tmp_path / "home" / ".local").exists()  # not created here


def test_root_with_a_writable_home_uses_it(env, tmp_path):
    env.setattr(statedir.os, "geteuid", lambda: 0)
    assert state_home() == tmp_path / "home" / ".local" / "state"


@pytest.mark.parametrize("home", ["missing", "readonly", "unset"])
def test_root_without_a_writable_home_uses_var_lib(env, tmp_path, home):
    env.setattr(statedir.os, "geteuid", lambda: 0)
    if home == "missing":
        env.setenv("HOME", str(tmp_path / "nowhere"))
    elif home == "readonly":
        env.setattr(statedir.os, "access", lambda path, mode: False)  # root passes chmod; a read-only mount
    else:
        env.setenv("HOME", "/")
    assert default_state_dir("sidecar-h-1") == Path("/var/lib/tfscache/sidecar-h-1")


def test_no_home_and_not_root_has_no_default(env):
    env.setenv("HOME", "/")
    with pytest.raises(OSError, match="set node.state_dir"):
        default_state_dir("sidecar-h-1")


def test_root_with_xdg_state_home_uses_it(env, tmp_path):
    env.setattr(statedir.os, "geteuid", lambda: 0)
    env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    env.setenv("HOME", str(tmp_path / "nowhere"))
    assert state_home() == tmp_path / "xdg"


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../x", "a b", "-x"])
def test_instance_must_be_a_slug(bad):
    with pytest.raises(ValueError, match="instance name"):
        default_state_dir(bad)


@pytest.mark.parametrize("address, name", [
    ("127.0.0.1:8500", "sidecar-127.0.0.1-8500"),
    ("127.0.0.1:8500,8501", "sidecar-127.0.0.1-8500"),  # the REST port is not the node's identity
    ("tfserving.default.svc:8500", "sidecar-tfserving.default.svc-8500"),
    ("localhost:9000", "sidecar-localhost-9000"),
])
def test_sidecar_instance_names(address, name):
    assert instance_name(node_address=address) == name
    assert default_state_dir(name).name == name


def test_odd_addresses_get_a_hash_so_names_stay_distinct():
    names = {instance_name(node_address=a) for a in ["[::1]:8500", "[::2]:8500", "1:8500", "h/x:1", "h-x:1",
                                                       "h" * 300 + ":1", "h" * 300 + ":2"]}
    assert len(names) == 7
    for name in names:
        assert name.startswith("sidecar-") and len(name) < 130
        default_state_dir(name)  # a valid slug
    assert instance_name(node_address="[::1]:8500") == instance_name(node_address="[::1]:8500")


def test_embedded_instance_name_is_a_stable_hash_of_the_resolved_repository(tmp_path, monkeypatch):
    repo = tmp_path / "models"
    repo.mkdir()
    name = instance_name(model_repository=repo)
    assert name.startswith("embedded-") and len(name) == len("embedded-") + 8
    int(name.removeprefix("embedded-"), 16)
    monkeypatch.chdir(tmp_path)
    assert instance_name(model_repository="models") == name  # relative, resolved
    (tmp_path / "link").symlink_to(repo)
    assert instance_name(model_repository=str(tmp_path / "link")) == name
    assert instance_name(model_repository=tmp_path / "other") != name


def test_instance_name_takes_exactly_one_source(tmp_path):
    with pytest.raises(TypeError):
        instance_name()
    with pytest.raises(TypeError):
        instance_name(node_address="h:1", model_repository=tmp_path)
    with pytest.raises(ValueError):
        instance_name(node_address=",8501")


def test_claim_creates_the_directory_and_excludes_a_second_holder(tmp_path):
    path = tmp_path / "state" / "sidecar-h-1"
    lock = claim(path)
    assert lock is not None and lock.held and path.is_dir()
    assert (path.stat().st_mode & 0o777) == 0o700
    assert (path / ".lock").read_text() == f"{os.getpid()}\n"
    assert claim(path) is None  # a second open file description: refused, even in this process
    lock.release()
    lock.release()  # twice is harmless
    assert not lock.held
    with claim(path) as again:
        assert again is not None and again.held
    assert not again.held


def test_claim_is_refused_while_another_process_holds_it(tmp_path):
    path = tmp_path / "sidecar-h-1"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tfscache.settings.statedir import claim; lock = claim(sys.argv[1]); "
                               "print(lock is not None, flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "True\n"
        assert claim(path) is None
        holder.kill()  # the lock goes with the process, SIGKILL included
        holder.wait(30)
    finally:
        holder.kill()
        holder.stdin.close()
        holder.stdout.close()
    lock = claim(path)
    assert lock is not None
    lock.release()


def test_claim_of_an_unwritable_place_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        claim(blocker / "sub")


def test_the_test_session_never_uses_the_real_state_home():
    """tests/conftest.py points XDG_STATE_HOME at the session's own directory."""
    home = Path(os.environ["XDG_STATE_HOME"])
    assert home.is_absolute() and "xdg_state_home" in home.name
    done = subprocess.run([sys.executable, "-c", "from tfscache.settings.statedir import state_home; print(state_home())"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(home)
