"""ModelRepository: name safety, version directories, TF Serving's NOT_FOUND texts, sizes."""

from __future__ import annotations

import grpc
import pytest

from tfscache import errors
from tfscache.kinds.oip.adapter import OipAdapter
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.repository.local import ModelRepository, check_name, parse_version


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "models"
    for name, versions in {"m": ["1", "00000123", "7"], "only_files": [], "empty": []}.items():
        for version in versions:
            (root / name / version).mkdir(parents=True)
            (root / name / version / "saved_model.pb").write_bytes(b"x" * 100)
    (root / "m" / "not_a_version").mkdir()
    (root / "m" / "999").write_bytes(b"a file, not a version directory")
    (root / "only_files").mkdir(parents=True, exist_ok=True)
    (root / "only_files" / "1").write_bytes(b"file")
    (root / "empty").mkdir(exist_ok=True)
    (tmp_path / "outside" / "1").mkdir(parents=True)
    return ModelRepository(root, rescan_s=0.0)


@pytest.mark.parametrize("name", ["", "a/b", "/etc", "a\0b", ".", "..", "x" * 256, "é" * 128])
def test_unsafe_names_are_invalid_argument(repo, name):
    with pytest.raises(errors.UnsafeModelName) as info:
        repo.resolve(name)
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.http_status == 400
    assert info.value.message.startswith(f"Invalid model name {errors.shorten(name)!r}: ")  # cut at 200


def test_unsafe_name_messages():
    with pytest.raises(errors.UnsafeModelName, match=r"^Invalid model name '': a model name must not be empty$"):
        check_name("")
    with pytest.raises(errors.UnsafeModelName, match=r"one path segment \(no '/' or NUL\)$"):
        check_name("../outside")
    with pytest.raises(errors.UnsafeModelName, match=r"must not be '\.' or '\.\.'$"):
        check_name("..")
    with pytest.raises(errors.UnsafeModelName, match=r"at most 255 bytes, got 256$"):
        check_name("x" * 256)


def test_longest_safe_name_is_accepted(repo):
    check_name("x" * 255)
    check_name("..x")
    with pytest.raises(errors.ModelNotFound):
        repo.resolve("x" * 255)


def test_parse_version_like_simple_atoi():
    assert parse_version("00000123") == 123
    assert parse_version("7") == 7
    assert parse_version("+5") == 5
    for text in ["abc", "1.5", "", "-1", "1e3", "٣", str(2**63)]:
        assert parse_version(text) is None


def test_versions_are_numeric_directories_only(repo):
    assert sorted(repo.versions("m")) == [1, 7, 123]
    assert repo.versions("m")[123].name == "00000123"
    assert repo.versions("only_files") == {}
    assert repo.versions("missing") == {}


def test_resolve_latest_and_specific(repo):
    latest = repo.resolve("m")
    assert (latest.name, latest.version, latest.path.name) == ("m", 123, "00000123")
    assert repo.resolve("m", 7).path == repo.root / "m" / "7"
    assert repo.resolve("m", 123).path == repo.root / "m" / "00000123"


@pytest.mark.parametrize("name, version, text, tf_text", [
    ("missing", None, "model missing is not in the model repository", "Latest(missing)"),
    ("empty", None, "model empty is not in the model repository", "Latest(empty)"),
    ("only_files", None, "model only_files is not in the model repository", "Latest(only_files)"),
    ("m", 2, "version 2 of model m is not in the model repository", "Specific(m, 2)"),
    ("m", 999, "version 999 of model m is not in the model repository", "Specific(m, 999)"),
    ("missing", 1, "version 1 of model missing is not in the model repository",
     "Specific(missing, 1)"),
])
def test_not_found_is_neutral_and_each_kind_words_it(repo, name, version, text, tf_text):
    """The generic repository's NOT_FOUND names the facts in tfscache's words; the TF Serving
    kind words it as TF Serving does (ServableRequest's DebugString), the OIP kinds leave it to
    their protocols' methods."""
    with pytest.raises(errors.ModelNotFound) as info:
        repo.resolve(name, version)
    assert info.value.message == text
    assert (info.value.name, info.value.version, info.value.neutral) == (name, version, True)
    assert info.value.grpc_code == grpc.StatusCode.NOT_FOUND
    worded = TFServingAdapter.missing(info.value)
    assert worded.message == f"Servable not found for request: {tf_text}"
    assert type(worded) is type(info.value) and not worded.neutral
    assert TFServingAdapter.missing(worded) is worded  # a worded one is left alone
    assert OipAdapter.missing(info.value) is info.value
    # A version missing from a model with others is told apart by its class (Triton words it apart).
    assert isinstance(info.value, errors.VersionNotFound) == (name == "m")


def test_latest_is_remembered_for_rescan_s(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    repo = ModelRepository(tmp_path, rescan_s=3600)
    assert repo.resolve("m").version == 1
    (tmp_path / "m" / "2").mkdir()
    assert repo.resolve("m").version == 1  # not rescanned yet
    assert ModelRepository(tmp_path, rescan_s=0).resolve("m").version == 2


def test_remembered_latest_that_vanished_is_rescanned(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "2").mkdir()
    repo = ModelRepository(tmp_path, rescan_s=3600)
    assert repo.resolve("m").version == 2
    (tmp_path / "m" / "2").rmdir()
    assert repo.resolve("m").version == 1
    (tmp_path / "m" / "1").rmdir()
    with pytest.raises(errors.ModelNotFound, match=r"^model m is not in the model repository$"):
        repo.resolve("m")


def test_disk_bytes_sums_files_and_does_not_follow_symlinks(tmp_path):
    version = tmp_path / "repo" / "m" / "1"
    (version / "variables").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"x" * 1000)
    (version / "variables" / "variables.data-00000-of-00001").write_bytes(b"y" * 5000)
    (tmp_path / "big_outside").mkdir()
    (tmp_path / "big_outside" / "blob").write_bytes(b"z" * 100_000)
    (version / "link").symlink_to(tmp_path / "big_outside")
    repo = ModelRepository(tmp_path / "repo")
    size = repo.disk_bytes("m", 1)
    assert 6000 <= size < 6000 + 200  # the symlink itself, never what it points to
    with pytest.raises(errors.ModelNotFound):
        repo.disk_bytes("m", 2)


def test_base_path_is_absolute_and_inside_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = ModelRepository("relative")
    assert repo.base_path("m") == tmp_path / "relative" / "m"
    assert repo.base_path("m").is_absolute()
    with pytest.raises(errors.UnsafeModelName):
        repo.base_path("..")
