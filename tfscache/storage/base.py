"""What every object store offers (a leaf module: the implementations and the tier import it)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tfscache.errors import Internal, ResourceExhausted, TfscacheError

ChunkHook = Callable[[str, int], Awaitable[None]]
"""Called after each chunk a download writes, with the key and the bytes so far (fault injection)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object under a store's prefix: its key relative to the prefix, size and ETag."""

    key: str
    size: int
    etag: str


class ObjectStore(Protocol):
    url: str  # the repository URL, as given; errors name it

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (a key prefix ending in "/"), all pages."""

    async def download(self, key: str, dest: Path, *, etag: str | None = None) -> int:
        """Stream object ``key`` into file ``dest`` (created or truncated); the bytes written.
        With ``etag``, the object must still have it (else Aborted)."""


def disk_error(exc: OSError, path: Path) -> TfscacheError:
    """A local file error as a client sees it: a full disk is RESOURCE_EXHAUSTED, the rest INTERNAL."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhausted(f"disk full writing {path}: {exc.strerror}")
    return Internal(f"cannot write {path}: {exc}")


async def settled(call: Callable, *args, abandoned: Callable | None = None, **kwargs):
    """``call(*args, **kwargs)`` in a worker thread, awaited to its end even when the caller is cancelled.

    A cancelled caller gets CancelledError only once the thread is done (and ``abandoned`` has
    been given its result, to close what it opened): a download cancelled because a sibling
    failed leaves no file operation running behind it to recreate the directory the tier
    removes (``mkdir(parents=True)`` would) or to write into it afterwards."""
    work = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
    cancelled: asyncio.CancelledError | None = None
    while not work.done():
        try:
            await asyncio.wait([work])
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is None:
        return work.result()
    if abandoned is not None and work.exception() is None:
        abandoned(work.result())
    raise cancelled


class TierEvents:
    """What the disk tier reports as it works (no-ops; ``tfscache.observe.tiermetrics`` counts them)."""

    def hit(self) -> None:
        """A fetch found its version complete and current on disk (concurrent fetches of one
        version share one look, and count once)."""

    def miss(self) -> None:
        """A fetch had to download its version (once per download, however many waited for it)."""

    def downloaded(self, seconds: float, size: int) -> None:
        """A version was downloaded: how long it took and its bytes."""

    def evicted(self, size: int) -> None:
        """A version was deleted to make room."""
