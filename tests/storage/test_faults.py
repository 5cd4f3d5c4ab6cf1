"""The store failing under the tier: killed mid-download (moto and fake-gcs-server), unreachable,
no credentials."""

from __future__ import annotations

import asyncio
import os
import socket

import grpc
import pytest

from support.gcs import FakeGcs
from support.s3 import MotoServer
from tfscache.errors import FailedPrecondition, Unavailable
from tfscache.storage import open_store
from tfscache.storage.layout import PARTIAL
from tfscache.storage.tier import DiskTier

BIG = 48 << 20  # more than loopback socket buffers hold: the stream cannot finish without the server


def upload(server: MotoServer | FakeGcs, big: bytes) -> None:
    objects = {"m/1/variables.data": big, "m/1/saved_model.pb": b"pb"}
    if isinstance(server, FakeGcs):
        server.upload(objects)  # the bucket exists and survives a restart (objects on disk)
        return
    client = server.client()
    client.create_bucket(Bucket="models")
    for key, data in objects.items():
        client.put_object(Bucket="models", Key=key, Body=data)
    client.close()


SERVERS = {"s3": lambda directory: MotoServer(directory).start(),
           "gs": lambda directory: FakeGcs(directory).start()}


@pytest.mark.parametrize("scheme", ["s3", "gs"])
async def test_the_store_killed_mid_download_leaves_nothing_and_recovers(tmp_path, monkeypatch, scheme):
    big = os.urandom(BIG)
    with SERVERS[scheme](tmp_path / "store") as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        upload(server, big)
        first_chunk, go_on = asyncio.Event(), asyncio.Event()

        async def hold_after_first_chunk(key: str, written: int) -> None:
            if key.endswith("variables.data") and not first_chunk.is_set():
                first_chunk.set()
                await go_on.wait()

        root = tmp_path / "tier"
        tier = DiskTier(root, 1 << 30, open_store(f"{scheme}://models", on_chunk=hold_after_first_chunk), rescan_s=0)
        await tier.start()
        fetch = asyncio.ensure_future(tier.fetch("m", 1))
        await asyncio.wait_for(first_chunk.wait(), 30)
        server.kill()
        go_on.set()
        with pytest.raises(Unavailable) as caught:
            await fetch
        assert caught.value.grpc_code == grpc.StatusCode.UNAVAILABLE
        assert caught.value.message.startswith(f"store {scheme}://models unreachable: ")
        assert tier.resident() == {} and not (root / "m" / "1").exists()
        assert list((root / PARTIAL).iterdir()) == []

        with pytest.raises(Unavailable, match="unreachable: Connection refused"):
            await tier.fetch("m", 1)  # still down: the cause is named

        if scheme == "s3":
            server.start(port=server.port)  # back, empty: moto keeps no state across restarts
            upload(server, big)
        else:
            server.start()  # back on the same port, its objects on disk

        path = await tier.fetch("m", 1)
        assert (path / "variables.data").stat().st_size == BIG
        assert (path / "variables.data").read_bytes() == big


async def test_a_resident_version_is_served_while_the_store_is_down(tmp_path, monkeypatch):
    with MotoServer(tmp_path / "moto") as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        upload(server, b"v" * 1000)
        tier = DiskTier(tmp_path / "tier", 1 << 30, open_store("s3://models"), rescan_s=0)
        await tier.start()
        path = await tier.fetch("m", 1)
        server.kill()
        assert await tier.fetch("m", 1) == path
        with pytest.raises(Unavailable, match="^store s3://models unreachable: Connection refused"):
            await tier.versions("m")


@pytest.fixture
def refusing_endpoint():
    """http://127.0.0.1:P where P is bound by this test and not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


async def test_missing_credentials_are_named(tmp_path, monkeypatch, moto, refusing_endpoint):
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", refusing_endpoint)  # no instance role here, nor anywhere else dialled
    tier = DiskTier(tmp_path / "tier", 1 << 30, open_store("s3://models"), rescan_s=0)
    await tier.start()
    with pytest.raises(FailedPrecondition) as caught:
        await tier.versions("m")
    assert caught.value.message.startswith(
        "no credentials for s3://models: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
