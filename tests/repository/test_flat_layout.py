"""The repository with MLServer's flat layout (tfscache.kinds.mlserver.layout): a model directory
holding model-settings.json itself is one version, named by ``parameters.version``; version
folders beside it keep working (a mixed repository); a bad settings file is a clear error."""

from __future__ import annotations

import json

import pytest

from tfscache import errors
from tfscache.frontend.protocols.oip.mlserver import named_version_key
from tfscache.frontend.protocols.oip.rest import parse_url
from tfscache.kinds.mlserver.layout import LAYOUT
from tfscache.repository.local import FLAT_VERSION, ModelRepository
from tfscache.wire import oip_heads_pb2


def settings(folder, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(fields))


@pytest.fixture
def repo(tmp_path):
    settings(tmp_path / "flat_v1", implementation="x", parameters={"version": "v1"})
    settings(tmp_path / "flat_none", name="flat_none", implementation="x")
    settings(tmp_path / "versioned" / "1", name="versioned", parameters={"version": "1"})
    settings(tmp_path / "versioned" / "2", name="versioned", parameters={"version": "2"})
    return ModelRepository(tmp_path, rescan_s=0.0, layout=LAYOUT)


def test_a_flat_model_is_one_version_named_by_its_settings(repo, tmp_path):
    found = repo.resolve("flat_v1")
    assert (found.version, found.path) == (FLAT_VERSION, tmp_path / "flat_v1")
    assert repo.version_name("flat_v1", FLAT_VERSION) == "v1"
    assert repo.version_name("flat_none", FLAT_VERSION) == ""
    assert repo.label_version("flat_v1", "v1") == FLAT_VERSION
    assert repo.version_of("flat_v1", "v1") == FLAT_VERSION
    assert repo.version_of("flat_none", "") == FLAT_VERSION
    assert repo.disk_bytes("flat_v1", FLAT_VERSION) > 0


def test_versioned_models_beside_flat_ones_are_unchanged(repo):
    assert repo.resolve("versioned").version == 2
    assert repo.versions("versioned").keys() == {1, 2}
    assert repo.label_version("versioned", "1") == 1
    assert repo.version_name("versioned", 2) == "2"
    assert repo.version_of("versioned", "2") == 2


def test_a_wrong_version_name_is_mlservers_not_found(repo):
    asked = (("flat_v1", "v2"), ("flat_none", "v1"), ("versioned", "v1"), ("ghost", "v1"))
    for name, version in asked:
        with pytest.raises(errors.NotFound) as caught:
            repo.label_version(name, version)
        assert caught.value.message == f"Model {name} with version {version} not found"
    with pytest.raises(errors.VersionNotFound):  # a number a flat model lacks
        repo.resolve("flat_v1", 3)


@pytest.mark.parametrize("text, problem", [
    ("{not json", "Malformed model settings file"),
    ("[1]", "expected a JSON object"),
    ('{"parameters": {"version": 3}}', "parameters.version must be a string, got 3"),
    ('{"name": "other"}', "names model 'other', but its folder is 'bad'"),
])
def test_a_bad_settings_file_is_a_clear_error(tmp_path, text, problem):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model-settings.json").write_text(text)
    repo = ModelRepository(tmp_path, rescan_s=0.0, layout=LAYOUT)
    with pytest.raises(errors.FailedPrecondition) as caught:
        repo.resolve("bad")
    assert problem in caught.value.message


def test_without_a_layout_a_flat_directory_is_no_model(tmp_path):
    settings(tmp_path / "flat", parameters={"version": "v1"})
    with pytest.raises(errors.ModelNotFound):
        ModelRepository(tmp_path, rescan_s=0.0).resolve("flat")


def test_mlserver_requests_carry_version_names():
    def head(version):
        return oip_heads_pb2.ModelNameHead(name="m", version=version).SerializeToString()
    assert named_version_key(head("v1")).label == "v1"
    assert named_version_key(head("3")).version == 3
    assert named_version_key(head("")).version is None
    assert parse_url("/v2/models/m/versions/v1/infer", True).key.label == "v1"
    assert parse_url("/v2/models/m/versions/3/infer", True).key.version == 3
    with pytest.raises(errors.NotFound):  # Triton's URLs: numbered versions only
        parse_url("/v2/models/m/versions/v1/infer")
