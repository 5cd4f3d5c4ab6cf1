"""Fixtures: a moto S3 server and a fake-gcs-server per module, a fresh bucket per test, the
store's variables set.

* ``moto``: one ``support.s3.MotoServer`` for the module (tests that kill a server start their own).
* ``fake_gcs``: one ``support.gcs.FakeGcs`` for the module.
* ``bucket``: a new bucket on moto (``s3``, the default) or on fake-gcs-server (``gs``): tests that
  run against both stores say so with ``support.buckets.on_each_store``. Same surface for both:
  ``url``, ``name``, ``server`` (its ``env``), ``put(key, data)``, ``delete(key)``, ``gets(key)``.
* ``s3_env``: AWS_ENDPOINT_URL, dummy keys and region in ``os.environ`` (open_store reads them).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from support.gcs import PROJECT, FakeGcs
from support.s3 import MotoServer

_names = itertools.count()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    with MotoServer(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory):
    with FakeGcs(tmp_path_factory.mktemp("gcs")).start() as server:
        yield server


@pytest.fixture
def s3_env(moto, monkeypatch):
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    return moto.env


class Bucket:
    def __init__(self, server: MotoServer, name: str) -> None:
        self.server, self.name = server, name
        self.client = server.client()
        self.client.create_bucket(Bucket=name)

    @property
    def url(self) -> str:
        return f"s3://{self.name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"models/{key}", Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=f"models/{key}")

    def gets(self, key: str) -> int:
        return self.server.get_count(f"{self.name}/models/{key}")


class GcsBucket:
    """A bucket on fake-gcs-server, set up through google-cloud-storage (the code under test uses obstore)."""

    def __init__(self, server: FakeGcs, name: str) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.server, self.name = server, name
        self.client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                     client_options={"api_endpoint": server.endpoint})
        self.client.create_bucket(name)

    @property
    def url(self) -> str:
        return f"gs://{self.name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.client.bucket(self.name).blob(f"models/{key}").upload_from_string(
            data, content_type="application/octet-stream")

    def delete(self, key: str) -> None:
        self.client.bucket(self.name).blob(f"models/{key}").delete()

    def gets(self, key: str) -> int:
        return self.server.get_count(f"{self.name}/models/{key}")


@pytest.fixture(params=["s3"])
def bucket(request, monkeypatch):
    """A fresh bucket on the store ``request.param`` names (s3 unless ``on_each_store``)."""
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        made = Bucket(request.getfixturevalue("moto"), f"models-{next(_names)}")
    else:
        server = request.getfixturevalue("fake_gcs")
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        made = GcsBucket(server, f"models-{next(_names)}")
    yield made
    made.client.close()


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "tier"
