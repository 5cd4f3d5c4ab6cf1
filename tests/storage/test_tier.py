"""DiskTier against real protocol servers, moto (s3://) and fake-gcs-server (gs://): listing,
single flight, LRU by bytes, adoption at restart, changed and deleted objects, the cap, unsafe
keys, a missing bucket."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import threading

import grpc
import pytest

from support.buckets import on_each_store
from support.gcsfix import GoogleAnswers
from tfscache.errors import FailedPrecondition, NotFound, ResourceExhausted, Unavailable
from tfscache.storage import open_store
from tfscache.repository.local import FLAT_VERSION as repository_flat_version
from tfscache.storage.layout import FLAT_VERSION, MARKER, PARTIAL
from tfscache.storage.tier import DiskTier


def tier_for(bucket, root, cap=1 << 30, **kw) -> DiskTier:
    return DiskTier(root, cap, open_store(bucket.url), rescan_s=0, **kw)


def seed(bucket, name="m", version=1, size=100_000) -> dict[str, bytes]:
    files = {"saved_model.pb": os.urandom(size), "variables/variables.data-00000-of-00001": os.urandom(size // 2),
             "assets/empty.txt": b""}
    for rel, data in files.items():
        bucket.put(f"{name}/{version}/{rel}", data)
    return files


async def test_versions_lists_only_numeric_versions_of_the_model(bucket, root):
    seed(bucket, "m", 1)
    seed(bucket, "m", 2, size=10)
    bucket.put("m/notaversion/x", b"x")
    bucket.put("m/3/", b"")  # a "directory" placeholder only
    bucket.put("m10/1/x", b"x")  # another model sharing the prefix's first letters
    tier = tier_for(bucket, root)
    await tier.start()
    found = await tier.versions("m")
    assert sorted(found) == [1, 2]
    assert found[1].bytes == 150_000
    assert bucket.server.log_text().count(f"GET /{bucket.name}?list-type=2&prefix=models/m/ ") == 1


@on_each_store
async def test_fetch_downloads_a_complete_version(bucket, root):
    files = seed(bucket)
    tier = tier_for(bucket, root)
    await tier.start()
    path = await tier.fetch("m", 1)
    assert path == root / "m" / "1"
    for rel, data in files.items():
        assert (path / rel).read_bytes() == data
    assert (path / MARKER).exists()
    assert tier.resident() == {("m", 1): 150_000}
    assert not list((root / PARTIAL).iterdir())


async def test_a_zero_padded_version_folder_downloads_as_its_number(bucket, root):
    files = seed(bucket, "m", "00000123")  # TF Serving's testdata names half_plus_two's so
    tier = tier_for(bucket, root)
    await tier.start()
    assert sorted(await tier.versions("m")) == [123]
    path = await tier.fetch("m", 123)
    assert path == root / "m" / "123"
    assert {rel: (path / rel).read_bytes() for rel in files} == files


@on_each_store
async def test_sixteen_concurrent_fetches_download_once(bucket, root):
    seed(bucket, size=2_000_000)
    tier = tier_for(bucket, root, parallel=2)
    await tier.start()
    paths = await asyncio.gather(*(tier.fetch("m", 1) for _ in range(16)))
    assert set(paths) == {root / "m" / "1"}
    assert bucket.gets("m/1/saved_model.pb") == 1
    assert bucket.gets("m/1/variables/variables.data-00000-of-00001") == 1
    await tier.fetch("m", 1)  # a warm fetch lists again but downloads nothing
    assert bucket.gets("m/1/saved_model.pb") == 1


def md5_b64_starting_with_weak_mark() -> bytes:
    """Bytes whose base64 MD5 (fake-gcs-server's ETag, listed bare) begins with ``W/``."""
    for i in range(1_000_000):
        data = f"weak-looking {i}".encode()
        if base64.b64encode(hashlib.md5(data).digest()).startswith(b"W/"):
            return data
    raise AssertionError("no such bytes found")


@on_each_store
async def test_an_etag_that_begins_like_a_weak_mark_is_compared_whole(bucket, root):
    # Found by a fresh-clone run: one object in 4,096 has a base64 MD5 beginning with "W/"; the
    # bare listed form lost those two characters as if a weak mark, the quoted GET form kept them,
    # and the download was refused as "changed during the download".
    data = md5_b64_starting_with_weak_mark()
    files = seed(bucket, "w", size=10)
    bucket.put("w/1/variables/variables.data-00000-of-00001", data)
    tier = tier_for(bucket, root)
    await tier.start()
    path = await tier.fetch("w", 1)
    assert (path / "variables" / "variables.data-00000-of-00001").read_bytes() == data
    assert (path / "saved_model.pb").read_bytes() == files["saved_model.pb"]


@on_each_store
async def test_lru_by_bytes_never_evicts_a_version_in_use(bucket, root):
    for name in "abcde":
        seed(bucket, name, size=100_000)  # 150 kB each
    used: dict[tuple[str, int], set[str]] = {}  # what the nodes do with each version (the caches' ledgers)
    tier = tier_for(bucket, root, cap=460_000, in_use=lambda key: used.get(key, set()))  # room for three
    await tier.start()
    await tier.fetch("a", 1)
    used[("a", 1)] = {"available"}
    await tier.fetch("b", 1)
    await tier.fetch("c", 1)
    await tier.fetch("d", 1)  # evicts b: a is older but served
    assert list(tier.resident()) == [("a", 1), ("c", 1), ("d", 1)]
    assert not (root / "b" / "1").exists() and (root / "a" / "1" / "saved_model.pb").exists()
    await tier.fetch("c", 1)  # c is now the most recent
    await tier.fetch("e", 1)  # evicts d
    assert list(tier.resident()) == [("a", 1), ("c", 1), ("e", 1)]
    assert tier.used_bytes <= 460_000
    used[("c", 1)] = {"loading"}
    used[("e", 1)] = {"available", "unloading"}
    with pytest.raises(ResourceExhausted, match=r"disk tier full.*storage.cache_bytes = 460000"):
        await tier.fetch("b", 1)
    assert list(tier.resident()) == [("a", 1), ("c", 1), ("e", 1)]
    del used[("a", 1)]  # unloaded from its node
    await tier.fetch("b", 1)
    assert list(tier.resident()) == [("c", 1), ("e", 1), ("b", 1)]


@on_each_store
async def test_a_version_bigger_than_the_tier_fails_at_once(bucket, root):
    seed(bucket, size=100_000)
    tier = tier_for(bucket, root, cap=100_000)
    await tier.start()
    with pytest.raises(ResourceExhausted) as caught:
        await tier.fetch("m", 1)
    assert caught.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.message == ("model 'm' version 1 needs 150000 bytes, more than the whole disk tier "
                                    "(storage.cache_bytes = 100000)")
    assert bucket.gets("m/1/saved_model.pb") == 0


@on_each_store
async def test_restart_adopts_complete_versions_and_removes_partial_ones(bucket, root):
    seed(bucket, "m", 1)
    seed(bucket, "m", 2)
    first = tier_for(bucket, root)
    await first.start()
    await first.fetch("m", 1)
    await first.fetch("m", 2)
    (root / PARTIAL / "m.3.dead").mkdir(parents=True)
    (root / PARTIAL / "m.3.dead" / "saved_model.pb").write_bytes(b"half")
    (root / "m" / "4").mkdir()
    (root / "m" / "4" / "saved_model.pb").write_bytes(b"no marker")
    with open(root / "m" / "2" / "saved_model.pb", "r+b") as f:
        f.truncate(10)  # a complete marker over a truncated file: not complete

    second = tier_for(bucket, root)
    await second.start()
    assert second.resident() == {("m", 1): 150_000}
    assert not (root / PARTIAL).exists()
    assert not (root / "m" / "4").exists() and not (root / "m" / "2").exists()
    await second.fetch("m", 1)
    assert bucket.gets("m/1/saved_model.pb") == 1  # adopted: not downloaded again


@on_each_store
async def test_a_changed_object_is_downloaded_again(bucket, root):
    seed(bucket)
    tier = tier_for(bucket, root)
    await tier.start()
    await tier.fetch("m", 1)
    bucket.put("m/1/saved_model.pb", b"new contents")
    path = await tier.fetch("m", 1)
    assert (path / "saved_model.pb").read_bytes() == b"new contents"
    assert bucket.gets("m/1/saved_model.pb") == 2
    assert bucket.gets("m/1/variables/variables.data-00000-of-00001") == 2
    assert tier.resident() == {("m", 1): 50_000 + len(b"new contents")}


@on_each_store
async def test_a_served_version_is_not_replaced_when_it_changes(bucket, root):
    files = seed(bucket)
    used: set[str] = set()
    tier = tier_for(bucket, root, in_use=lambda key: used)
    await tier.start()
    await tier.fetch("m", 1)
    used.add("available")  # a node serves it
    bucket.put("m/1/saved_model.pb", b"new contents")
    path = await tier.fetch("m", 1)
    assert (path / "saved_model.pb").read_bytes() == files["saved_model.pb"]
    used.clear()  # unloaded: the next load may take the new copy
    assert (await tier.fetch("m", 1) / "saved_model.pb").read_bytes() == b"new contents"


@on_each_store
async def test_an_object_deleted_after_listing_fails_cleanly_then_succeeds(bucket, root):
    seed(bucket)
    tier = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=3600)
    await tier.start()
    await tier.versions("m")
    bucket.delete("m/1/saved_model.pb")
    with pytest.raises(NotFound) as caught:
        await tier.fetch("m", 1)
    assert caught.value.message == f"object 'm/1/saved_model.pb' not found in {bucket.url}"
    assert tier.resident() == {} and not (root / "m" / "1").exists()
    assert not list((root / PARTIAL).iterdir())
    path = await tier.fetch("m", 1)  # listed again after the failure
    assert not (path / "saved_model.pb").exists() and (path / "assets" / "empty.txt").exists()
    await tier.stop()  # its listings' refresher (rescan_s > 0)


@pytest.mark.parametrize("bucket", ["s3", "gs"], indirect=True)
async def test_an_object_overwritten_after_listing_is_refused_by_etag(bucket, root):
    seed(bucket, size=1000)
    tier = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=3600)
    await tier.start()
    await tier.versions("m")
    bucket.put("m/1/saved_model.pb", b"x" * 1000)  # same size, other ETag
    with pytest.raises(Exception) as caught:
        await tier.fetch("m", 1)
    assert caught.value.grpc_code == grpc.StatusCode.ABORTED
    assert "changed during the download" in caught.value.message
    assert tier.resident() == {} and not list((root / PARTIAL).iterdir())
    assert (await tier.fetch("m", 1) / "saved_model.pb").read_bytes() == b"x" * 1000
    await tier.stop()


@pytest.mark.parametrize("key", ["m/1/../../../evil", "m/1/a/../../../../evil", "m/1//evil", "m/1/./evil",
                                 "m/1/.tfscache-complete"])
async def test_unsafe_keys_are_never_written(bucket, root, tmp_path, key):
    seed(bucket, size=10)
    bucket.client.put_object(Bucket=bucket.name, Key=f"models/{key}", Body=b"evil")
    tier = tier_for(bucket, root)
    await tier.start()
    with pytest.raises(FailedPrecondition, match="object key .* refused"):
        await tier.fetch("m", 1)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("bucket", ["s3", "gs"], indirect=True)
async def test_a_missing_bucket_is_named(bucket, root, monkeypatch):
    """On gs:// through a proxy that answers fake-gcs-server's listing of a missing bucket as GCS
    does (404 NoSuchBucket; the server itself answers 500: the next test), everything else unchanged."""
    url, gs = bucket.url.replace(bucket.name, "no-such-bucket"), bucket.url.startswith("gs:")
    with GoogleAnswers(bucket.server.endpoint) if gs else contextlib.nullcontext() as proxy:
        if gs:
            monkeypatch.setenv("GOOGLE_BASE_URL", proxy.endpoint)
        tier = DiskTier(root, 1 << 30, open_store(url), rescan_s=0)
        await tier.start()
        with pytest.raises(FailedPrecondition) as caught:
            await tier.fetch("m", 1)
    assert caught.value.message == f"bucket 'no-such-bucket' of {url} does not exist"
    assert not gs or proxy.corrected == 1  # the proxy rewrote that answer, and only that


@pytest.mark.parametrize("bucket", ["gs"], indirect=True)
async def test_a_store_answering_500_is_unavailable_and_named(bucket, root):
    """fake-gcs-server's own answer to a listing of a missing bucket, 500: a failing store."""
    url = bucket.url.replace(bucket.name, "no-such-bucket")
    tier = DiskTier(root, 1 << 30, open_store(url), rescan_s=0)
    await tier.start()
    with pytest.raises(Unavailable) as caught:
        await tier.fetch("m", 1)
    assert url in caught.value.message and "500" in caught.value.message


@on_each_store
async def test_an_unknown_version_is_not_found(bucket, root):
    seed(bucket)
    tier = tier_for(bucket, root)
    await tier.start()
    with pytest.raises(NotFound, match=f"version 9 of model 'm' not found in {bucket.url}"):
        await tier.fetch("m", 9)


# --- flat models (MLServer's own layout: NAME/model-settings.json, no version folder) ---

SETTINGS = "model-settings.json"


def seed_flat(bucket, name="f", size=1000, version="v1") -> dict[str, bytes]:
    settings = {"parameters": {"uri": "./model.joblib", "version": version}}
    files = {SETTINGS: json.dumps(settings).encode(),
             "model.joblib": os.urandom(size), "extra/notes.txt": b"notes"}
    for rel, data in files.items():
        bucket.put(f"{name}/{rel}", data)
    return files


async def test_a_flat_model_is_one_version_downloaded_into_its_own_directory(bucket, root):
    files = seed_flat(bucket)
    seed(bucket, "m", 1, size=10)  # versioned beside it: laid out as ever
    bucket.put("m/config.pbtxt", b"cfg")
    tier = tier_for(bucket, root, flat_file=SETTINGS)
    await tier.start()
    [(version, listing)] = (await tier.versions("f")).items()
    size = sum(map(len, files.values()))
    assert (version, listing.flat, listing.bytes) == (FLAT_VERSION, True, size)
    assert sorted(await tier.versions("m")) == [1]
    copy = await tier.flat_settings("f")  # before any download: the settings file alone
    assert copy == root / ".flat" / "f" / SETTINGS and copy.read_bytes() == files[SETTINGS]
    assert bucket.gets("f/model.joblib") == 0
    path = await tier.fetch("f", FLAT_VERSION)
    assert path == root / "f" and (path / MARKER).exists()
    assert {rel: (path / rel).read_bytes() for rel in files} == files
    assert await tier.flat_settings("f") == root / "f" / SETTINGS  # the downloaded copy's own
    assert bucket.gets(f"f/{SETTINGS}") == 2
    assert await tier.fetch("m", 1) == root / "m" / "1" and (root / "m" / "config.pbtxt").exists()
    assert tier.resident() == {("f", FLAT_VERSION): listing.bytes, ("m", 1): 15}
    assert not list((root / PARTIAL).iterdir())
    with pytest.raises(NotFound, match="has no model-settings.json"):
        await tier.flat_settings("m")


async def test_without_flat_file_a_flat_model_has_no_versions(bucket, root):
    seed_flat(bucket)
    tier = tier_for(bucket, root)  # TF Serving's and Triton's tiers: no flat models
    await tier.start()
    assert await tier.versions("f") == {}


async def test_restart_adopts_a_flat_model_and_removes_partial_ones(bucket, root):
    seed_flat(bucket, "f")
    seed_flat(bucket, "g")
    seed(bucket, "m", 1, size=10)
    first = tier_for(bucket, root, flat_file=SETTINGS)
    await first.start()
    for key in [("f", FLAT_VERSION), ("g", FLAT_VERSION), ("m", 1)]:
        await first.fetch(*key)
    await first.flat_settings("f")
    (root / PARTIAL / "h.flat.dead").mkdir(parents=True)  # a download cut short
    (root / PARTIAL / "h.flat.dead" / SETTINGS).write_bytes(b"{}")
    with open(root / "g" / "model.joblib", "r+b") as f:
        f.truncate(10)  # a flat copy whose marker lies: not complete
    (root / "h").mkdir()
    (root / "h" / SETTINGS).write_bytes(b"{}")  # a flat model's files with no marker
    second = tier_for(bucket, root, flat_file=SETTINGS)
    await second.start()
    assert second.resident() == {("f", FLAT_VERSION): first.resident()[("f", FLAT_VERSION)],
                                 ("m", 1): 15}
    assert not (root / "g").exists() and not (root / "h").exists()
    assert not (root / PARTIAL).exists() and not (root / ".flat").exists()
    assert await second.fetch("f", FLAT_VERSION) == root / "f"
    assert bucket.gets("f/model.joblib") == 1  # adopted: not downloaded again
    third = tier_for(bucket, root)  # the same directory for a kind with no flat models
    await third.start()
    assert third.resident() == {("m", 1): 15} and not (root / "f").exists()


async def test_a_model_that_turns_flat_replaces_its_versions(bucket, root):
    old = seed(bucket, "f", 1, size=10)
    used: set[str] = set()
    tier = tier_for(bucket, root, flat_file=SETTINGS, in_use=lambda key: used)
    await tier.start()
    await tier.fetch("f", 1)
    for rel in old:
        bucket.delete(f"f/1/{rel}")
    files = seed_flat(bucket, "f")  # re-laid out as MLServer's own layout: flat
    used.add("available")  # a node still serves version 1
    with pytest.raises(FailedPrecondition, match="changed its layout"):
        await tier.fetch("f", FLAT_VERSION)
    assert tier.resident() == {("f", 1): 15}
    used.clear()
    path = await tier.fetch("f", FLAT_VERSION)
    assert (path / SETTINGS).read_bytes() == files[SETTINGS] and not (path / "1").exists()
    assert list(tier.resident()) == [("f", FLAT_VERSION)]


def test_the_flat_version_is_the_repositorys():
    assert FLAT_VERSION == repository_flat_version


async def test_a_cancelled_file_operation_ends_before_its_caller_does():
    # A download cancelled because a sibling failed must not leave a thread behind it: the tier
    # removes the partial directory next, and a late mkdir(parents=True) would make it again.
    from tfscache.storage.base import settled

    held, closed = threading.Event(), []
    caller = asyncio.ensure_future(settled(lambda: held.wait() and "opened", abandoned=closed.append))
    await asyncio.sleep(0)
    caller.cancel()
    finished, _ = await asyncio.wait([caller], timeout=0.2)
    assert not finished  # still waiting for its thread
    held.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert closed == ["opened"]  # what the thread opened was handed back to be closed
    assert await settled(int, "7") == 7
    with pytest.raises(ValueError):
        await settled(int, "x")
