"""The tier's pure parts and open_store's URL table (no server)."""

from __future__ import annotations

import pytest

from tfscache.errors import FailedPrecondition, InvalidArgument, UnsafeModelName
from tfscache.storage import STORES, ObjectInfo, is_remote, open_store
from tfscache.storage.layout import check_name, group_versions, plan_eviction, safe_relpath


def test_plan_eviction_takes_least_recent_unheld_versions_by_bytes():
    resident = {("a", 1): 100, ("b", 1): 100, ("c", 1): 100}
    order = list(resident)
    assert plan_eviction(resident, order, set(), 300, 150, 300) == [("a", 1), ("b", 1)]
    assert plan_eviction(resident, order, {("a", 1)}, 300, 150, 300) == [("b", 1), ("c", 1)]
    assert plan_eviction(resident, order, {("a", 1), ("b", 1)}, 300, 150, 300) is None
    assert plan_eviction(resident, order, set(), 300, 0, 300) == []


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "a//b", "./x", "a/.", "a\\..\\x", ".tfscache-complete"])
def test_unsafe_relative_keys_are_refused(rel):
    with pytest.raises(FailedPrecondition, match="refused"):
        safe_relpath(rel, "s3://b/p")


@pytest.mark.parametrize("name", ["", ".partial", "..", "a/b", "a\\b"])
def test_unsafe_model_names_are_refused(name):
    with pytest.raises(UnsafeModelName):
        check_name(name)


def test_group_versions_keeps_numeric_version_files():
    found = group_versions("m", [ObjectInfo("m/1/a", 1, "e1"), ObjectInfo("m/1/", 0, ""), ObjectInfo("m/x/a", 1, ""),
                                 ObjectInfo("m/2/d/b", 2, "e2")])
    assert {v: listing.objects for v, listing in found.items()} == {1: (("a", 1, "e1"),), 2: (("d/b", 2, "e2"),)}


def test_a_zero_padded_version_folder_is_its_number_and_kept_for_download():
    found = group_versions("m", [ObjectInfo("m/00000123/a", 1, "e1"),
                                 ObjectInfo("m/123/b", 2, "e2"), ObjectInfo("m/00000123/c", 3, "e3")])
    assert {v: (listing.folder, listing.objects) for v, listing in found.items()} == {
        123: ("00000123", (("a", 1, "e1"), ("c", 3, "e3")))}


def test_open_store_picks_by_scheme_and_refuses_others():
    assert sorted(STORES) == ["az", "gs", "s3"]
    assert is_remote("s3://b/p") and not is_remote("/models")
    with pytest.raises(InvalidArgument, match="unsupported model repository URL 'ftp://b/p'"):
        open_store("ftp://b/p")
    with pytest.raises(InvalidArgument, match="must be s3://BUCKET/PREFIX"):
        open_store("s3:///p")
