"""Listings off the request path (issue 25): a version the tier holds completely is served without
a LIST or a GET; listings are refreshed in the background, so new and vanished versions show
without a request. Against a real moto server, reached through a proxy that can hold every
request (support.holdproxy): a request that needed the store would wait there.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import requests

from support.buckets import gets, in_tier, metrics_port, predict, serve_bucket, upload
from support.holdproxy import HoldProxy
from support.waiting import until, wait_until
from tfscache.admin.client import AdminClient
from tfscache.storage import open_store
from tfscache.storage.tier import DiskTier


def seed(bucket, name="m", version=1) -> None:
    for rel, data in {"saved_model.pb": b"pb" * 500, "variables/variables.index": b"index"}.items():
        bucket.put(f"{name}/{version}/{rel}", data)


def lists_on_request(serve) -> int:
    status = requests.get(f"http://127.0.0.1:{metrics_port(serve)}/status", timeout=10).json()
    return status["disk_tier"]["lists"]["on_request"]


def test_a_tier_hit_goes_to_the_node_without_a_list_or_a_get(tmp_path, bucket, moto, synthetic_models,
                                                              monkeypatch):
    sizes = upload(bucket, synthetic_models([1])[0])
    tier = tmp_path / "tier"
    with HoldProxy(("127.0.0.1", moto.port)) as proxy:
        monkeypatch.setattr(bucket.server, "port", proxy.port)  # serve's AWS_ENDPOINT_URL: the proxy
        with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB", "--admin-port", "0",
                          "--set", "storage.list_interval_s=0.2") as serve:
            assert predict(serve, "addk_1", 1.0) == [2.0]  # listed and downloaded: a bucket miss
            assert in_tier(tier) == {"addk_1:1"}
            waited = lists_on_request(serve)
            admin_port = json.loads((serve.directory / "ports.json").read_text())["admin"]
            with AdminClient(f"127.0.0.1:{admin_port}") as admin:
                admin.evict("addk_1")
            results: list = []
            with proxy.holding():  # the store answers nothing from here on
                time.sleep(0.5)  # so the listing is older than list_interval_s (a clock condition, not a race)
                thread = threading.Thread(target=lambda: results.append(predict(serve, "addk_1", 5.0)))
                thread.start()
                wait_until(lambda: results, 20, "the tier hit answered while the store is held")
            thread.join(30)
            assert results == [[6.0]]
            assert lists_on_request(serve) == waited  # the refresher listed, no request waited
    assert all(count == 1 for count in gets(bucket, sizes, "addk_1").values())


async def test_after_a_restart_versions_on_disk_answer_before_any_listing(bucket, moto, root, monkeypatch):
    seed(bucket)
    first = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=0)
    await first.start()
    await first.fetch("m", 1)
    with HoldProxy(("127.0.0.1", moto.port)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        second = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=0.2)
        await second.start()
        try:
            with proxy.holding():
                assert set(await asyncio.wait_for(second.versions("m"), 20)) == {1}
                assert await asyncio.wait_for(second.fetch("m", 1), 20) == root / "m" / "1"
                assert second.listings.waited == 0 and second.listed("m") is None
            # then listed in the background
            await until(lambda: second.listed("m") is not None, 30, "m listed")
        finally:
            await second.stop()
    assert bucket.gets("m/1/saved_model.pb") == 1


async def test_new_and_vanished_versions_show_without_a_request(bucket, root):
    seed(bucket, version=1)
    tier = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=0.2)
    await tier.start()
    try:
        assert set(await tier.versions("m")) == {1}  # asked for: kept fresh from now on
        seed(bucket, version=2)
        await until(lambda: set(tier.listed("m")) == {1, 2}, 30, "versions 1 and 2 listed")
        for key in ("m/1/saved_model.pb", "m/1/variables/variables.index"):
            bucket.delete(key)
        await until(lambda: set(tier.listed("m")) == {2}, 30, "version 2 alone listed")
        assert tier.listings.waited == 1 and tier.listings.refreshed >= 2
    finally:
        await tier.stop()


async def test_a_version_missing_from_an_old_listing_is_listed_at_once(bucket, root):
    seed(bucket, version=1)
    tier = DiskTier(root, 1 << 30, open_store(bucket.url), rescan_s=0.2, list_active_s=0)  # no refresher lists
    await tier.start()
    try:
        assert set(await tier.versions("m")) == {1}
        seed(bucket, version=2)
        await asyncio.sleep(0.3)  # the listing is now older than rescan_s (a clock condition, not a race)
        assert set(await tier.versions("m")) == {1}  # the latest: the old listing answers, a refresh is queued
        assert set(await tier.versions("m", 2)) == {1, 2}  # a version it lacks: listed at once
        assert tier.listings.waited == 2
    finally:
        await tier.stop()
