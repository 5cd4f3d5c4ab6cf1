"""The GCS and Azure protocol servers the storage tests run against (docs/storage.md, "Emulators"):
fake-gcs-server (support.gcs) and Azurite (support.azure), each its own process on
127.0.0.1. Each starts, holds a bucket/container of ``NAME/VERSION/file`` objects that the
official client lists and downloads, is reached by a client configured only through the
cloud's standard variables, and comes back on the same port with its objects after a stop
or a kill (what the fault tests need). Then ``open_store`` on each: gs:// and az:// list and
download through them.
"""

from __future__ import annotations

import os
import socket

import pytest

from support import azure, gcs

from tfscache.storage import ObjectInfo, open_store

gcs_server = gcs.gcs_server
azurite = azure.azurite

VERSION_1 = {
    "half_plus_two/1/saved_model.pb": b"\x08\x01" * 700,
    "half_plus_two/1/variables/variables.index": b"index",
    "half_plus_two/1/variables/variables.data-00000-of-00001": os.urandom(300_000),
    "half_plus_two/1/assets/empty.txt": b"",
}
OBJECTS = {
    **VERSION_1,
    "half_plus_two/2/saved_model.pb": b"two",
    "half_plus_two10/1/saved_model.pb": b"a sibling whose name starts alike",
}


@pytest.fixture(params=["gcs", "azure"])
def emulator(request):
    """Each emulator in turn (same surface: upload, listing, read, start, stop, kill, port)."""
    return request.getfixturevalue({"gcs": "gcs_server", "azure": "azurite"}[request.param])


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_lists_and_downloads_a_version_through_the_official_client(emulator):
    emulator.upload(OBJECTS, durable=False)

    assert emulator.listing("half_plus_two/1/") == {key: len(data) for key, data in VERSION_1.items()}
    for key, data in VERSION_1.items():
        assert emulator.read(key) == data


def test_restarts_on_the_same_port_with_its_objects(emulator):
    emulator.upload(OBJECTS)  # durable: a kill must not lose it (Azurite saves its metadata every 5 s)
    port = emulator.port

    emulator.stop()
    assert refused(port)
    emulator.start()
    assert emulator.port == port
    assert emulator.listing() == {key: len(data) for key, data in OBJECTS.items()}

    emulator.kill()
    assert refused(port)
    emulator.start()
    assert emulator.port == port
    assert emulator.listing() == {key: len(data) for key, data in OBJECTS.items()}
    assert emulator.read("half_plus_two/1/variables/variables.data-00000-of-00001") == \
        VERSION_1["half_plus_two/1/variables/variables.data-00000-of-00001"]


def test_gcs_client_configured_by_the_environment_alone(gcs_server, monkeypatch):
    """google-cloud-storage: STORAGE_EMULATOR_HOST alone sends it to the emulator, unauthenticated."""
    from google.cloud import storage

    gcs_server.upload(VERSION_1)
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)

    client = storage.Client()
    try:
        blobs = list(client.list_blobs(gcs_server.bucket, prefix="half_plus_two/1/"))
        assert {blob.name: blob.size for blob in blobs} == {key: len(data) for key, data in VERSION_1.items()}
        assert client.bucket(gcs_server.bucket).blob("half_plus_two/1/saved_model.pb").download_as_bytes() == \
            VERSION_1["half_plus_two/1/saved_model.pb"]
    finally:
        client.close()


def test_azure_client_configured_by_the_environment_alone(azurite, monkeypatch):
    """azure-storage-blob: from AZURE_STORAGE_CONNECTION_STRING (the SDK reads no variable itself)."""
    from azure.storage.blob import BlobServiceClient

    azurite.upload(VERSION_1, durable=False)
    for name, value in azurite.env.items():
        monkeypatch.setenv(name, value)

    with BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) as service:
        container = service.get_container_client(azurite.container)
        blobs = list(container.list_blobs(name_starts_with="half_plus_two/1/"))
        assert {blob.name: blob.size for blob in blobs} == {key: len(data) for key, data in VERSION_1.items()}
        assert container.download_blob("half_plus_two/1/saved_model.pb").readall() == \
            VERSION_1["half_plus_two/1/saved_model.pb"]


async def test_open_store_az_lists_and_downloads_through_azurite(azurite, monkeypatch, tmp_path):
    """obstore's AzureStore from AZURE_STORAGE_ACCOUNT_NAME, _ACCOUNT_KEY and _ENDPOINT alone."""
    etags = azurite.upload({f"models/{key}": data for key, data in OBJECTS.items()}, durable=False)
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT"):
        monkeypatch.setenv(name, azurite.env[name])

    store = open_store(f"az://{azurite.container}/models")
    listed = await store.list("half_plus_two/1")

    # ETags as obstore gives them: the SDK's, without its quotes.
    assert sorted(listed, key=lambda info: info.key) == sorted(
        (ObjectInfo(key, len(data), etags[f"models/{key}"].strip('"')) for key, data in VERSION_1.items()),
        key=lambda info: info.key)
    for info in listed:
        dest = tmp_path / info.key.replace("/", "_")
        assert await store.download(info.key, dest, etag=info.etag) == info.size
        assert dest.read_bytes() == VERSION_1[info.key]


async def test_open_store_gs_lists_and_downloads_through_fake_gcs_server(gcs_server, monkeypatch, tmp_path):
    """obstore's GCSStore from GOOGLE_BASE_URL, unsigned (GOOGLE_SKIP_SIGNATURE): no credentials exist."""
    gcs_server.upload({f"models/{key}": data for key, data in VERSION_1.items()})
    for name in ("GOOGLE_BASE_URL", "GOOGLE_SKIP_SIGNATURE"):
        monkeypatch.setenv(name, gcs_server.env[name])

    store = open_store(f"gs://{gcs_server.bucket}/models")
    listed = await store.list("half_plus_two/1")

    assert {info.key: info.size for info in listed} == {key: len(data) for key, data in VERSION_1.items()}
    for info in listed:
        dest = tmp_path / info.key.replace("/", "_")
        assert await store.download(info.key, dest, etag=info.etag) == info.size
        assert dest.read_bytes() == VERSION_1[info.key]
