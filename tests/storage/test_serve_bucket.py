"""`tfscache serve --model-repository s3://...` against a real moto server process (issue 13),
and gs://... against fake-gcs-server (issue 25) for the tests marked ``on_each_store``.

Embedded `tfscache node` children load from the disk tier (`--disk-cache-dir`), never from
the bucket. Covered here, through the official TF Serving stubs and plain HTTP:

* lazy loads (gRPC, REST, a version label from the bucket's labels.json);
* 16 concurrent cold requests for one model: every object downloaded once;
* the tier's LRU by bytes, which never deletes a version a node serves;
* adoption of complete versions and removal of partial ones at restart;
* faults: the store down (UNAVAILABLE naming it; resident models keep serving; the next
  request after it is back succeeds), an object deleted (NOT_FOUND, retried next time),
  a changed object (downloaded again), a full disk (RESOURCE_EXHAUSTED), a version larger
  than the whole tier (RESOURCE_EXHAUSTED naming the cap);
* /metrics and /status report the tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import grpc
import pytest
import requests

from support.buckets import MARKER, gets, on_each_store, in_tier, metrics_port, predict, predict_error, serve_bucket, upload, \
    version_bytes
from support.tfs_traffic import Traffic
from support.waiting import wait_until

@pytest.fixture(scope="module")
def models(synthetic_models):
    """addk_1..addk_6, about 200 KB each (so bytes, not file counts, decide the tier's LRU)."""
    return synthetic_models(6, size_bytes=200_000)


@on_each_store
def test_lazy_loads_through_serve_from_a_bucket(tmp_path, bucket, models):
    sizes = {}
    for base in models[:2]:
        sizes.update(upload(bucket, base))
    bucket.put("addk_1/labels.json", json.dumps({"stable": 1}).encode())
    tier = tmp_path / "tier"
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB") as serve:
        assert in_tier(tier) == set()  # nothing is listed or downloaded at start-up
        assert predict(serve, "addk_1", 1.0) == [2.0]
        reply = requests.post(f"http://127.0.0.1:{serve.rest_port}/v1/models/addk_2:predict",
                              json={"instances": [1.0]}, timeout=120)
        assert reply.status_code == 200 and reply.json() == {"predictions": [3.0]}
        assert predict(serve, "addk_1", 5.0, label="stable") == [6.0]
        assert in_tier(tier) == {"addk_1:1", "addk_2:1"}
        assert json.loads((tier / "addk_1" / "labels.json").read_text()) == {"stable": 1}
        assert all(count == 1 for count in gets(bucket, sizes, "addk_1").values())

        status = requests.get(f"http://127.0.0.1:{metrics_port(serve)}/status", timeout=10).json()
        assert status["disk_tier"]["versions"] == 2
        assert status["disk_tier"]["bytes"] == version_bytes(sizes, "addk_1") + version_bytes(sizes, "addk_2")
        assert status["disk_tier"]["cap_bytes"] == 100 << 20
        metrics = requests.get(f"http://127.0.0.1:{metrics_port(serve)}/metrics", timeout=10).text
        assert "tfscache_disk_tier_misses_total 2.0" in metrics
        assert f"tfscache_downloaded_bytes_total {float(status['disk_tier']['bytes'])}" in metrics
        assert "tfscache_download_duration_seconds_count 2.0" in metrics
        text = subprocess.run([sys.executable, "-m", "tfscache", "status", "--address",
                               f"127.0.0.1:{metrics_port(serve)}"], capture_output=True, text=True, timeout=60)
        assert text.returncode == 0, text.stderr
        assert "disk tier" in text.stdout and "2 versions" in text.stdout


@on_each_store
def test_sixteen_concurrent_cold_requests_download_once(tmp_path, bucket, models):
    sizes = upload(bucket, models[2])
    tier = tmp_path / "tier"
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB") as serve:
        results: list[object] = []
        start = threading.Barrier(16)

        def client():
            start.wait()
            try:
                results.append(predict(serve, "addk_3", 1.0))
            except grpc.RpcError as exc:
                results.append(exc)

        threads = [threading.Thread(target=client) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert results == [[4.0]] * 16
        assert gets(bucket, sizes, "addk_3") == {key: 1 for key in sizes}


def test_tier_lru_by_bytes_never_deletes_a_served_version(tmp_path, bucket, models):
    sizes = {}
    for base in models[:3]:
        sizes.update(upload(bucket, base))
    largest = max(version_bytes(sizes, f"addk_{k}") for k in (1, 2, 3))
    tier = tmp_path / "tier"
    # Two versions fit on disk, not three; a node holds two models.
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", str(int(largest * 2.5)),
                      "--max-models-per-node", "2") as serve:
        assert predict(serve, "addk_1") == [2.0]
        assert predict(serve, "addk_2") == [3.0]
        assert predict(serve, "addk_1") == [2.0]  # a hit: the node's LRU is now addk_2; the tier's addk_1
        assert predict(serve, "addk_3") == [4.0]  # the node unloads addk_2; addk_1 stays on disk (served)
        assert in_tier(tier) == {"addk_1:1", "addk_3:1"}
        assert predict(serve, "addk_2") == [3.0]  # downloaded again: it was evicted from disk
        assert bucket.gets("addk_2/1/saved_model.pb") == 2
        assert bucket.gets("addk_1/1/saved_model.pb") == 1


def test_restart_adopts_complete_versions_and_removes_partial_ones(tmp_path, bucket, models):
    sizes = upload(bucket, models[3])
    tier = tmp_path / "tier"
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB") as serve:
        assert predict(serve, "addk_4") == [5.0]
    partial = tier / ".partial" / "addk_4.1.dead"
    partial.mkdir(parents=True)
    (partial / "saved_model.pb").write_bytes(b"half")
    unmarked = tier / "addk_5" / "1"
    unmarked.mkdir(parents=True)
    (unmarked / "saved_model.pb").write_bytes(b"no marker: an interrupted copy")
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB") as serve:
        assert not partial.exists() and not unmarked.exists()
        assert predict(serve, "addk_4") == [5.0]
    assert all(count == 1 for count in gets(bucket, sizes, "addk_4").values())  # adopted, not downloaded again


def test_store_down_is_unavailable_and_recovers(tmp_path, moto, bucket, models):
    sizes = {}
    for base in models[:2]:
        sizes.update(upload(bucket, base))
    tier = tmp_path / "tier"
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB",
                      "--set", "cache.failure_backoff_s=60") as serve:
        assert predict(serve, "addk_1") == [2.0]
        port = moto.port
        moto.kill()
        try:
            error = predict_error(serve, "addk_2")
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert bucket.url in error.details() and "unreachable" in error.details()
            assert predict(serve, "addk_1") == [2.0]  # resident: served without the store
        finally:
            moto.start(port=port)  # moto's state starts empty again
        bucket.client.create_bucket(Bucket=bucket.name)
        for base in models[:2]:
            upload(bucket, base)
        assert predict(serve, "addk_2") == [3.0]  # no failure backoff for a store's error


@on_each_store
def test_deleted_object_is_not_found_and_retried(tmp_path, bucket, models):
    sizes = upload(bucket, models[4])
    tier = tmp_path / "tier"
    # A listing is reused for 60 s: the status probe lists the model, then an object goes.
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB",
                      "--set", "storage.list_interval_s=60") as serve:
        status = requests.get(f"http://127.0.0.1:{serve.rest_port}/v1/models/addk_5", timeout=60)
        assert status.status_code == 200, status.text  # listed, not downloaded
        victim = next(key for key in sizes if "variables.data" in key)
        bucket.delete(victim)
        error = predict_error(serve, "addk_5")
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
        assert victim in error.details() and bucket.url in error.details()
        assert in_tier(tier) == set() and not list((tier / ".partial").glob("*"))  # nothing half-written kept
        bucket.put(victim, (models[4] / victim.split("/", 1)[1]).read_bytes())
        assert predict(serve, "addk_5") == [6.0]  # no failure backoff: listed again and downloaded


@on_each_store
def test_changed_object_is_downloaded_again(tmp_path, bucket, models, synthetic_models):
    sizes = upload(bucket, models[5])
    upload(bucket, models[0])
    tier = tmp_path / "tier"
    with serve_bucket(tmp_path, bucket, tier, "--disk-cache-bytes", "100MiB", "--max-models-per-node", "1",
                      "--set", "storage.list_interval_s=0") as serve:
        assert predict(serve, "addk_6") == [7.0]
        assert predict(serve, "addk_1") == [2.0]  # addk_6 leaves the node: its copy may be replaced now
        # Version 1 of addk_6 rewritten in the bucket (new contents, new ETags): y = x + 9 now.
        upload(bucket, synthetic_models([9], size_bytes=200_000)[0], name="addk_6")
        assert predict(serve, "addk_6") == [10.0]
        assert gets(bucket, sizes, "addk_6") == {key: 2 for key in sizes}  # the version, downloaded again


def test_version_larger_than_the_tier_is_refused_naming_the_cap(tmp_path, bucket, models):
    sizes = upload(bucket, models[0])
    cap = version_bytes(sizes, "addk_1") // 2
    with serve_bucket(tmp_path, bucket, tmp_path / "tier", "--disk-cache-bytes", str(cap)) as serve:
        error = predict_error(serve, "addk_1")
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"storage.cache_bytes = {cap}" in error.details()
        assert bucket.gets("addk_1/1/saved_model.pb") == 0  # refused before any download


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: the disk fills up during a download (mounting needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the disk-full path is covered at the tier level")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_full_disk_is_resource_exhausted(tmp_path, bucket, synthetic_models, small_disk):
    sizes = upload(bucket, synthetic_models([7], size_bytes=2_000_000)[0])
    with serve_bucket(tmp_path, bucket, small_disk / "tier", "--disk-cache-bytes", "1GiB") as serve:
        error = predict_error(serve, "addk_7")
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        assert "disk full" in error.details()
        assert not list((small_disk / "tier" / ".partial").glob("*"))
        # The process keeps serving: the model's status is answered from the listing.
        reply = requests.get(f"http://127.0.0.1:{serve.rest_port}/v1/models/addk_7", timeout=60)
        assert reply.status_code == 200, reply.text
    assert sizes["addk_7/1/variables/variables.data-00000-of-00001"] > 1 << 20


@on_each_store
def test_churn_more_models_than_fit_fails_no_request(tmp_path, bucket, models):
    sizes = {}
    for base in models:
        sizes.update(upload(bucket, base))
    largest = max(version_bytes(sizes, f"addk_{k}") for k in range(1, 7))
    names = [f"addk_{k}" for k in range(1, 7)]
    # Six models; three fit on disk, two on each node.
    with serve_bucket(tmp_path, bucket, tmp_path / "tier", "--disk-cache-bytes", str(int(largest * 3.5)),
                      "--max-models-per-node", "2") as serve, \
            Traffic(serve.grpc_target, f"http://127.0.0.1:{serve.rest_port}", names, clients=16,
                    timeout=120) as traffic:
        wait_until(lambda: traffic.ok() >= 300, 300, "300 requests under churn")
    traffic.check()
    downloads = sum(bucket.gets(f"{name}/1/saved_model.pb") for name in names)
    assert downloads > len(names)  # the tier did evict and download again: churn, not a warm cache


def test_version_labels_from_a_bucket_through_worker_processes(tmp_path, bucket, models):
    """With --workers the worker processes have no repository of their own for a bucket: a request
    naming a label goes on with its label to the control process, which resolves it from the tier."""
    upload(bucket, models[0])
    bucket.put("addk_1/labels.json", json.dumps({"stable": 1}).encode())
    with serve_bucket(tmp_path, bucket, tmp_path / "tier", "--disk-cache-bytes", "100MiB", "--workers", "2") as serve:
        for _ in range(4):  # cold, then warm, through whichever worker the kernel picks
            assert predict(serve, "addk_1", 5.0, label="stable") == [6.0]
            reply = requests.post(f"http://127.0.0.1:{serve.rest_port}/v1/models/addk_1/labels/stable:predict",
                                  json={"instances": [1.0]}, timeout=120)
            assert reply.status_code == 200 and reply.json() == {"predictions": [2.0]}
        with pytest.raises(grpc.RpcError) as caught:
            predict(serve, "addk_1", 1.0, label="nope")
        error = caught.value
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                   "Unrecognized servable version label: nope")
