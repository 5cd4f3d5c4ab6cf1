"""Model repositories in object stores (s3://, gs://, az://) behind a local disk tier.

    store = open_store("s3://bucket/models")        # credentials/endpoints from the environment
    await store.list("half_plus_two/")              # [ObjectInfo(key, size, etag), ...]
    await store.download("half_plus_two/1/saved_model.pb", dest, etag=info.etag)

Keys are relative to the URL's prefix. The implementation is picked by scheme from
``STORES`` (one obstore-backed module serves all three clouds; docs/storage.md says why).
Every error a store raises is already a ``TfscacheError`` (translated once, in
``objstore.translate``):

    Unavailable          UNAVAILABLE         store unreachable, timed out or failing (5xx)
    FailedPrecondition   FAILED_PRECONDITION no such bucket/container, no credentials, access denied
    NotFound             NOT_FOUND           an object listed a moment ago is gone
    Aborted              ABORTED             an object changed while it was downloaded (ETag)

The disk tier (``tier.DiskTier``) is what the rest of tfscache uses: nodes never read
from a bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from tfscache.errors import InvalidArgument
from tfscache.storage import objstore
from tfscache.storage.base import ChunkHook, ObjectInfo, ObjectStore

__all__ = ["ChunkHook", "ObjectInfo", "ObjectStore", "STORES", "is_remote", "open_store"]

# scheme -> constructor(bucket, prefix, url, on_chunk). A new cloud is one row here.
STORES: dict[str, Callable[..., ObjectStore]] = {
    "s3": objstore.s3,
    "gs": objstore.gcs,
    "az": objstore.azure,
}


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object store (a scheme in ``STORES``) rather than a local path."""
    return urlsplit(str(url)).scheme in STORES


def open_store(url: str, *, on_chunk: ChunkHook | None = None) -> ObjectStore:
    """The store for ``scheme://bucket/prefix``; InvalidArgument naming the URL if unsupported."""
    parts = urlsplit(url)
    if parts.scheme not in STORES:
        raise InvalidArgument(
            f"unsupported model repository URL {url!r}: expected one of "
            + ", ".join(f"{s}://BUCKET/PREFIX" for s in STORES))
    if not parts.netloc or parts.query or parts.fragment:
        raise InvalidArgument(
            f"model repository URL {url!r} must be {parts.scheme}://BUCKET/PREFIX"
        )
    prefix = parts.path.strip("/")
    return STORES[parts.scheme](parts.netloc, prefix, url, on_chunk)
