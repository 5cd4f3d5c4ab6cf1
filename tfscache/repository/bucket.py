"""A model repository in a bucket (s3://, gs://, az://), seen through the local disk tier.

``RemoteRepository`` is a ``tfscache.repository.local.ModelRepository`` whose root is the tier's
directory, so nodes are given local paths (``ROOT/NAME`` as TF Serving's base_path, ``ROOT``
as Triton's model repository) and never read the bucket. What differs:

* Versions come from the bucket's listing of ``NAME/`` (``DiskTier.versions``, refreshed in the
  background: ``tfscache.storage.listings``), or from the complete versions in the tier until
  the model is first listed, not from the directory: a version is known before it was
  downloaded. Sizes on disk are the listed object sizes.
* ``prepare(name, version)`` downloads the version into the tier (once, however many ask). The
  cache's reloader calls it for the versions it admitted, after their victims left the node,
  so the room they held on disk is free; from admission until the node unloaded it, the
  version is in the cache's ledger and ``in_use`` keeps it in the tier.
* The model's own files (``labels.json``, Triton's ``config.pbtxt``) are copied beside the
  versions at each fetch and when a request names a label.
* With a kind's ``layout`` (MLServer's), a model whose directory in the bucket holds the layout's
  settings file is flat, as the bucket lists it: one version, ``FLAT_VERSION``, downloaded into
  ``ROOT/NAME`` itself; its version's name is read from a copy of that file alone
  (``DiskTier.flat_settings``), so a request naming it needs no download. Its labels are its
  versions' names, as for a local directory; labels.json is not read.

The synchronous methods (``versions``, ``resolve``, ``version_path``, ``disk_bytes``,
``is_flat``, ``version_name``) are called in worker threads, as for a local directory; they wait
for the tier's coroutines on the event loop. Called on the event loop itself they raise rather
than deadlock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from tfscache import errors
from tfscache.repository.local import (FLAT_VERSION, LABELS_FILE, FlatLayout, ModelRepository,
                                       check_name, not_found)
from tfscache.storage.layout import VersionListing
from tfscache.storage.tier import DiskTier

T = TypeVar("T")


class RemoteRepository(ModelRepository):
    """The models under a bucket URL, downloaded on demand into ``tier``."""

    local = False  # nodes read the tier, which the cache fills before each load (``prepare``)

    def __init__(self, url: str, tier: DiskTier, *, rescan_s: float = 1.0,
                 layout: FlatLayout | None = None) -> None:
        """``layout``: flat models, as for a local directory; the tier's ``flat_file`` must be its
        settings file."""
        super().__init__(tier.root, rescan_s=rescan_s, layout=layout)
        self.url = url
        self.tier = tier
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    async def start(self) -> None:
        """Adopt what the tier holds on disk; remember the loop the tier's coroutines run on."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        await self.tier.start()

    async def stop(self) -> None:
        """Stop the tier's background listing refresher."""
        await self.tier.stop()

    def set_in_use(self, in_use: Callable[[tuple[str, int]], set[str]]) -> None:
        """What the nodes do with a version now (``DiskTier``'s ``in_use``): one in use stays in the tier."""
        self.tier.in_use = in_use

    # -- what the cache calls -----------------------------------------------------------

    async def prepare(self, name: str, version: int) -> None:
        """Download the version into the tier unless it is there and current (one download however
        many ask). The cache calls it for a version it admitted (in its ledger: ``in_use`` keeps it).
        """
        await self.tier.fetch(name, version)

    def versions(self, name: str) -> dict[int, Path]:
        """The bucket's versions of ``name``; with the store unreachable, the ones on disk in the tier
        (a model the nodes serve keeps serving through an outage), or Unavailable if none."""
        try:
            listed = self._listing(name)
        except errors.Unavailable:
            listed = [v for n, v in self.tier.resident() if n == name]
            if not listed:
                raise
        return {v: self.tier.location(name, v) for v in listed}

    def is_flat(self, name: str) -> bool:
        """Whether the bucket lists ``name`` as a flat model (unreachable: whether the tier holds
        a flat copy of it)."""
        if self.layout is None:
            return False
        try:
            listing = self._listing(name).get(FLAT_VERSION)
        except errors.Unavailable:
            if not self.tier.has_flat(name):
                raise
            return True
        return listing is not None and listing.flat

    def version_name(self, name: str, version: int) -> str:
        """As for a local directory, from a copy of a flat model's settings file (blocking)."""
        if version == FLAT_VERSION and self.is_flat(name):
            return self.layout.version_name(self._wait(self.tier.flat_settings(name)), name)
        return str(version)

    def version_path(self, name: str, version: int) -> Path | None:
        """The version's directory in the tier if the bucket lists it (downloaded or not). With the
        store unreachable, a version on disk in the tier still counts (nodes serve it meanwhile)."""
        try:
            listed = version in self._listing(name, version)
        except errors.Unavailable:
            if (name, version) in self.tier.resident():
                return self.tier.location(name, version)
            raise
        return self.tier.location(name, version) if listed else None

    def vanished(self, keys) -> list[tuple[str, int]]:
        """Versions the bucket's last listing of their model lacks. Lists nothing: the cache asks at
        every step, and a listing per resident model per step would be a storm of LIST calls; a model's
        listing is renewed by the requests for it (at most once per ``rescan_s``)."""
        gone = []
        for name, version in keys:
            listing = self.tier.listed(name)
            if listing is not None and version not in listing:
                gone.append((name, version))
        return gone

    def disk_bytes(self, name: str, version: int) -> int:
        listing = self._listing(name, version).get(version)
        if listing is None:
            raise not_found(name, version)
        if listing.bytes > self.tier.cap_bytes:  # before the cache makes room for it on a node
            raise self.tier.too_large((name, version), listing.bytes)
        return listing.bytes

    def exists(self, name: str) -> bool:
        return bool(self._listing(name))

    async def refresh_labels(self, name: str) -> None:
        """Copy the bucket's labels.json beside the versions (if listed or changed), then read it.
        With a layout, the labels are the versions' names: nothing to copy."""
        check_name(name)
        if self.layout is not None:
            await super().refresh_labels(name)
            return
        try:
            # one listing per rescan_s; a download if changed
            await self.tier.model_file(name, LABELS_FILE)
        except errors.Unavailable:
            if not await asyncio.to_thread((self.root / name / LABELS_FILE).is_file):
                raise
        await super().refresh_labels(name)

    # -- the bridge from worker threads to the tier ---------------------------------------

    def _listing(self, name: str, need: int | None = None) -> dict[int, VersionListing]:
        check_name(name)
        return self._wait(self.tier.versions(name, need))

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            coro.close()
            raise errors.Internal(
                f"repository {self.url}: listed before start() or on the event loop "
                "(the listing is awaited from a worker thread)"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
