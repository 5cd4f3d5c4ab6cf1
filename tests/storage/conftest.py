"""Fixtures: a moto S3 server per module, a fresh bucket per test, the AWS_* variables set.

* ``moto``: one ``support.s3.MotoServer`` for the module (tests that kill a server start their own).
* ``bucket``: a new bucket name on it; ``put(key, data)`` uploads under that bucket.
* ``s3_env``: AWS_ENDPOINT_URL, dummy keys and region in ``os.environ`` (open_store reads them).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from support.s3 import MotoServer

_names = itertools.count()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    with MotoServer(tmp_path_factory.mktemp("moto")) as server:
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


@pytest.fixture
def bucket(moto, s3_env):
    made = Bucket(moto, f"models-{next(_names)}")
    yield made
    made.client.close()


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "tier"
