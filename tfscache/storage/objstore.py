"""ObjectStore over obstore (Rust's object_store): S3, GCS and Azure behind one API.

Credentials, regions and endpoints come only from each cloud's standard environment
variables and credential chains, read by object_store itself (S3: AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, web identity,
ECS/EC2 metadata; GCS: GOOGLE_SERVICE_ACCOUNT / GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_BASE_URL;
Azure: AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_ENDPOINT, ...).
The only thing added here: an ``http://`` endpoint in those variables allows plain HTTP
(object_store refuses it by default, with a bare "Error performing list request").

Timeouts: connect 5 s; a read that stalls 30 s fails; a whole request may take an hour
(object_store's default of 30 s for the whole body would kill any large object).
Errors are translated once, in ``translate``, to the codes in the package docstring.
"""

from __future__ import annotations

import asyncio
import os
import re
from datetime import timedelta
from pathlib import Path

from tfscache.errors import (
    Aborted,
    FailedPrecondition,
    NotFound,
    TfscacheError,
    Unavailable,
    shorten,
)
from tfscache.storage.base import ChunkHook, ObjectInfo, disk_error, settled

CHUNK_BYTES = 2 << 20  # chosen with scripts/bench_storage.py over 1, 2 and 4 MiB (docs/storage.md)
CLIENT_OPTIONS = {"connect_timeout": timedelta(seconds=5), "read_timeout": timedelta(seconds=30),
                  "timeout": timedelta(hours=1)}
RETRY = {
    "max_retries": 3,
    "retry_timeout": timedelta(seconds=20),
    "backoff": {
        "init_backoff": timedelta(milliseconds=100),
        "max_backoff": timedelta(seconds=2),
        "base": 2,
    },
}

# scheme -> (endpoint variables whose http:// value allows plain HTTP, where credentials come from)
ENDPOINT_VARS = {
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "gs": ("GOOGLE_BASE_URL",),
    "az": ("AZURE_STORAGE_ENDPOINT", "AZURITE_BLOB_STORAGE_URL"),
}
CREDENTIALS_HINT = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE, "
    "or run with an instance role",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT, or run with a service account",
    "az": "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, a SAS "
    "or AZURE_CLIENT_ID/SECRET/TENANT_ID",
}
OS_CAUSE = re.compile(r'message: "([^"]+)"')
CREDENTIAL_MARKS = (
    "/latest/api/token",
    "/latest/meta-data",
    "credential",
    "computeMetadata",
    "/metadata/identity",
)
MISSING_CONTAINER = ("NoSuchBucket", "ContainerNotFound", "The specified bucket does not exist")


def client_options(scheme: str) -> dict:
    http = any(os.environ.get(var, "").startswith("http://") for var in ENDPOINT_VARS[scheme])
    return {**CLIENT_OPTIONS, "allow_http": True} if http else dict(CLIENT_OPTIONS)


class ObstoreStore:
    """One bucket (container) and prefix; keys are relative to the prefix."""

    def __init__(
        self, scheme: str, bucket: str, url: str, store, on_chunk: ChunkHook | None
    ) -> None:
        self.scheme, self.bucket, self.url = scheme, bucket, url
        self._store = store
        self._on_chunk = on_chunk

    async def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        prefix = prefix if prefix.endswith("/") else prefix + "/"
        try:
            found = await obstore.list(self._store, prefix, chunk_size=1000).collect_async()
        except Exception as exc:  # obstore's errors, and the builtin ones it raises
            raise self.translate(exc, prefix) from exc
        return [ObjectInfo(o["path"], o["size"], o.get("e_tag") or "") for o in found]

    async def download(self, key: str, dest: Path, *, etag: str | None = None) -> int:
        import obstore

        try:
            result = await obstore.get_async(
                self._store, key, options={"if_match": etag} if etag else None
            )
            stream = result.stream(min_chunk_size=CHUNK_BYTES)
        except Exception as exc:
            raise self.translate(exc, key) from exc
        got = result.meta.get("e_tag")
        # a store that ignored If-Match sent other bytes
        if etag and got and _bare(got) != _bare(etag):
            raise self.changed(key, f"listed with ETag {etag}, sent with {got}")
        out = await self._open(dest)
        written = 0
        try:
            while True:
                try:
                    chunk = await anext(stream, None)
                except Exception as exc:
                    raise self.translate(exc, key) from exc
                if chunk is None:
                    return written
                await self._local(out.write, chunk)
                written += len(chunk)
                if self._on_chunk is not None:
                    await self._on_chunk(key, written)
        finally:
            try:
                await self._local(out.close)
            except BaseException:  # cancelled (a sibling download failed) or a failed flush:
                out.close()  # close it here rather than leave the file to the garbage collector
                raise

    @classmethod
    async def _open(cls, dest: Path):
        """``dest`` opened for writing in a worker thread; a file opened after its caller was
        cancelled is closed, not left to the garbage collector."""
        return await cls._local(open, dest, "wb", abandoned=lambda out: out.close())

    @staticmethod
    async def _local(call, *args, abandoned=None):
        """A file operation in a worker thread, finished before a cancellation is raised
        (``settled``); OSError as disk_error (a full disk: RESOURCE_EXHAUSTED)."""
        try:
            return await settled(call, *args, abandoned=abandoned)
        except OSError as exc:
            raise disk_error(
                exc, Path(args[0]) if args and isinstance(args[0], (str, Path)) else Path("?")
            ) from exc

    def changed(self, key: str, detail: str = "") -> Aborted:
        """Object ``key`` no longer has the ETag it was listed with."""
        return Aborted(f"object {key!r} in {self.url} changed during the download"
                       + (f" ({detail})" if detail else ""))

    def translate(self, exc: Exception, key: str) -> TfscacheError:
        """obstore's error for ``key`` as the TfscacheError a client sees (package docstring)."""
        import obstore.exceptions as obx

        text = str(exc)
        head = shorten(text.split("\n\nDebug source")[0].strip(), 300)
        found = OS_CAUSE.search(text)
        cause = f"{found.group(1)} ({head})" if found else head
        if any(mark in text for mark in MISSING_CONTAINER):
            return FailedPrecondition(f"bucket {self.bucket!r} of {self.url} does not exist")
        if isinstance(exc, obx.InvalidPathError) or "invalid path" in text:
            return FailedPrecondition(
                f"unsafe object key under {key!r} in {self.url}: refused ({head})"
            )
        if isinstance(exc, (FileNotFoundError, obx.NotFoundError)):
            return NotFound(f"object {key!r} not found in {self.url}")
        if isinstance(exc, obx.PreconditionError):
            return self.changed(key)
        if isinstance(exc, obx.UnauthenticatedError) or any(m in text for m in CREDENTIAL_MARKS):
            return FailedPrecondition(
                f"no credentials for {self.url}: {CREDENTIALS_HINT[self.scheme]}; cause: {cause}"
            )
        if isinstance(exc, (PermissionError, obx.PermissionDeniedError)) or "AccessDenied" in text:
            return FailedPrecondition(f"access to {self.url} denied: {cause}")
        return Unavailable(f"store {self.url} unreachable: {cause}")


def _bare(etag: str) -> str:
    """An ETag without its quotes (fake-gcs-server lists it bare and quotes it on a GET) or weak mark.

    The weak mark is ``W/`` before a quote only: a bare ETag is often a base64 MD5, and one in
    4,096 of those begins with ``W/`` itself."""
    if etag.startswith('W/"'):
        etag = etag[2:]
    return etag.strip('"')


def _build(
    scheme: str, factory, bucket: str, prefix: str, url: str, on_chunk: ChunkHook | None
) -> ObstoreStore:
    try:
        store = factory(
            bucket, prefix=prefix or None, client_options=client_options(scheme), retry_config=RETRY
        )
    except Exception as exc:  # a configuration object_store rejects (e.g. no Azure account name)
        head = shorten(str(exc).split("\n\nDebug source")[0].strip(), 300)
        raise FailedPrecondition(f"cannot open {url}: {head} ({CREDENTIALS_HINT[scheme]})") from exc
    return ObstoreStore(scheme, bucket, url, store, on_chunk)


def s3(bucket: str, prefix: str, url: str, on_chunk: ChunkHook | None = None) -> ObstoreStore:
    from obstore.store import S3Store

    return _build("s3", S3Store, bucket, prefix, url, on_chunk)


def gcs(bucket: str, prefix: str, url: str, on_chunk: ChunkHook | None = None) -> ObstoreStore:
    from obstore.store import GCSStore

    return _build("gs", GCSStore, bucket, prefix, url, on_chunk)


def azure(container: str, prefix: str, url: str, on_chunk: ChunkHook | None = None) -> ObstoreStore:
    from obstore.store import AzureStore

    return _build("az", AzureStore, container, prefix, url, on_chunk)
