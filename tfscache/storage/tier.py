"""DiskTier: a bounded local copy of a bucket's model versions, which nodes load from.

    tier = DiskTier(Path("/dev/shm/tfscache"), 20 << 30, open_store("s3://bucket/models"))
    await tier.start()                       # adopt complete versions, remove partial ones
    await tier.versions("half_plus_two")     # {123: VersionListing, ...}: tfscache.storage.listings
    path = await tier.fetch("half_plus_two", 123)   # ROOT/half_plus_two/123
    await tier.stop()                        # the listings' background refresher

Listings are kept off the request path (``tfscache.storage.listings``): a version the tier holds
completely is served from disk without a LIST or a GET; the model's listing is refreshed in the
background, and a copy whose listing changed is downloaded again at its next fetch.

A cold fetch downloads the version once however many ask (one future per version), at
most ``parallel`` objects at a time, into ROOT/.partial, checks every size (and each
object's ETag, sent as If-Match), writes the marker last and renames the directory into
place. Room is made first by evicting least recently used versions no node uses (``in_use``);
a version larger than the whole tier fails at once. A version whose listing no longer
matches its marker is downloaded again (unless a node serves the copy it loaded).
Files are touched only in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from tfscache.errors import Aborted, DataLoss, NotFound, ResourceExhausted, Unavailable
from tfscache.storage.base import ObjectStore, TierEvents, disk_error
from tfscache.storage.layout import (
    PARTIAL,
    Key,
    VersionListing,
    check_name,
    plan_eviction,
    remove,
    safe_relpath,
    scan,
    write_marker,
)
from tfscache.storage.listings import Listings

log = logging.getLogger("tfscache.storage.tier")

LOADERS = {"loading"}  # the use of a version that a changed copy may still be swapped in for


class DiskTier:

    def __init__(
        self,
        root: Path,
        cap_bytes: int,
        store: ObjectStore,
        *,
        parallel: int = 8,
        rescan_s: float = 1.0,
        in_use: Callable[[Key], set[str]] | None = None,
        events: TierEvents | None = None,
        list_rate: float = 20.0,
        list_active_s: float = 600.0,
    ) -> None:
        """``in_use(key)``: what the nodes do with that version now, as states of their caches'
        ledgers ("loading", "available", "unloading"; empty: nothing). A version in use is never
        evicted; one a node serves ("available", "unloading") is never replaced either.
        ``rescan_s``, ``list_rate``, ``list_active_s``: the listings' (``Listings``)."""
        self.root, self.cap_bytes, self.store = Path(root), cap_bytes, store
        self.rescan_s = rescan_s
        self.in_use = in_use or (lambda key: set())
        self.events = events or TierEvents()
        self.listings = Listings(store, interval_s=rescan_s, rate=list_rate, active_s=list_active_s,
                                 on_disk=self._on_disk)
        self._local_files: dict[tuple[str, str], tuple[int, str]] = {}  # ... and the copies on disk
        self._file_flights: dict[str, asyncio.Future] = {}
        self._gate = asyncio.Semaphore(parallel)
        # LRU first; (bytes, manifest)
        self._resident: OrderedDict[Key, tuple[int, dict]] = OrderedDict()
        self._reserved: dict[Key, int] = {}
        self._flights: dict[Key, asyncio.Future] = {}

    async def start(self) -> None:
        """Adopt the complete versions on disk (oldest marker first in LRU order) and remove partial
        ones. Over the cap (it was lowered), nothing is deleted yet: which versions the nodes serve is
        known only once the caches re-adopted them, so the next download makes the room."""
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        for key, manifest, _ in sorted(
            await asyncio.to_thread(scan, self.root), key=lambda a: a[2]
        ):
            self._resident[key] = (sum(size for size, _ in manifest.values()), manifest)
        log.log(logging.WARNING if self.used_bytes > self.cap_bytes else logging.INFO,
                "disk tier %s: adopted %d versions, %d bytes (storage.cache_bytes = %d)", self.root,
                len(self._resident), self.used_bytes, self.cap_bytes)
        await self.listings.start(sorted({name for name, _ in self._resident}))

    async def stop(self) -> None:
        """Stop refreshing listings in the background."""
        await self.listings.stop()

    # --- state, read by the cache and the tests ---

    @property
    def used_bytes(self) -> int:
        return sum(size for size, _ in self._resident.values()) + sum(self._reserved.values())

    def resident(self) -> dict[Key, int]:
        """Complete versions on disk and their bytes, least recently used first."""
        return {key: size for key, (size, _) in self._resident.items()}

    @property
    def downloads_in_flight(self) -> int:
        return len(self._flights)

    def describe(self) -> dict:
        """The tier in ``/status`` and ``tfscache status``."""
        return {"url": self.store.url, "directory": str(self.root), "bytes": self.used_bytes,
                "cap_bytes": self.cap_bytes, "versions": len(self._resident),
                "downloads_in_flight": self.downloads_in_flight, "in_use": len(self.protected()),
                "lists": self.listings.describe()}

    def path(self, name: str, version: int) -> Path:
        return self.root / check_name(name) / str(version)

    def protected(self) -> set[Key]:
        """Versions on disk that must stay: a node loads or serves them."""
        return {key for key in self._resident if self.in_use(key)}

    # --- listing ---

    async def versions(self, name: str, need: int | None = None) -> dict[int, VersionListing]:
        """The versions of ``name`` in the bucket: the last listing, or the complete versions on disk,
        refreshed in the background; listed now only when neither answers (``Listings.versions``).
        """
        return await self.listings.versions(check_name(name), need)

    def listed(self, name: str) -> dict[int, VersionListing] | None:
        """The model's last listing however old, without listing; None if never listed."""
        return self.listings.last(name)

    def _on_disk(self, name: str) -> dict[int, VersionListing]:
        """The complete versions of ``name`` in the tier, as the listings they were downloaded from."""
        return {
            v: VersionListing(
                tuple(sorted((rel, size, etag) for rel, (size, etag) in manifest.items()))
            )
            for (n, v), (_, manifest) in self._resident.items()
            if n == name
        }

    async def model_file(self, name: str, rel: str) -> Path | None:
        """The local copy of one of the model's own files (``labels.json``), refreshed from the
        listing; None when the bucket has no such file."""
        await self.versions(name)
        await self.sync_model_files(name)
        path = self.root / check_name(name) / rel
        return path if (name, rel) in self._local_files else None

    async def sync_model_files(self, name: str) -> None:
        """Make ROOT/NAME's own files (config.pbtxt, labels.json) match the last listing: each changed
        one downloaded and renamed into place, each no longer listed removed."""
        await self._single(self._file_flights, name, self._sync_files(name))

    async def _sync_files(self, name: str) -> None:
        listed = self.listings.files(name)
        if listed is None:  # not listed since start-up (served from disk): keep what is there
            return
        for rel, (size, etag) in listed.items():
            if self._local_files.get((name, rel)) == (size, etag):
                continue
            temp = self.root / PARTIAL / f"{name}.{secrets.token_hex(4)}.file"
            try:
                await self._get(f"{name}/{rel}", temp, size, etag)
                await asyncio.to_thread(_replace, temp, self.root / name / rel)
            except BaseException:
                await asyncio.shield(asyncio.to_thread(remove, temp))
                raise
            self._local_files[(name, rel)] = (size, etag)
        for (model, rel) in [k for k in self._local_files if k[0] == name and k[1] not in listed]:
            await asyncio.to_thread(remove, self.root / model / rel)
            self._local_files.pop((model, rel), None)

    # --- fetch ---

    async def fetch(self, name: str, version: int) -> Path:
        """The local directory of a complete copy of ``name``/``version``, downloaded if needed."""
        key = (check_name(name), version)
        while True:
            path = await self._single(self._flights, key, self._fetch(key))
            if key in self._resident:  # re-checked: another fetch may have evicted it meanwhile
                self._resident.move_to_end(key)
                return path

    async def _single(self, flights: dict, key, work) -> object:
        """One ``work`` per key at a time; later callers await the same result (errors too)."""
        flight = flights.get(key)
        if flight is None:
            flight = flights[key] = asyncio.ensure_future(work)
            flight.add_done_callback(
                lambda f: flights.pop(key, None) if flights.get(key) is f else None
            )
        else:
            work.close()
        return await asyncio.shield(flight)

    async def _fetch(self, key: Key) -> Path:
        name, version = key
        try:
            listing = (await self.versions(name, version)).get(version)
        except Unavailable:
            if key not in self._resident:
                raise
            log.warning(
                "disk tier: %s unreachable; serving %s version %d from disk", self.store.url, *key
            )
            self.events.hit()
            return self.path(*key)
        if listing is None:
            raise NotFound(f"version {version} of model {name!r} not found in {self.store.url}")
        await self.sync_model_files(name)
        resident = self._resident.get(key)
        if resident is not None and (resident[1] == listing.manifest()
                                     # a node serves that copy: keep it
                                     or self.in_use(key) - LOADERS):
            self.events.hit()
            return self.path(*key)
        self.events.miss()
        for rel, _, _ in listing.objects:
            safe_relpath(rel, self.store.url)
        victims = self._plan_room(key, listing.bytes)
        self._reserved[key] = listing.bytes  # before any await: the next plan counts it
        evicted = [(victim, self._resident.pop(victim)[0]) for victim in victims]
        try:
            await self._evict(evicted)
            return await self._download(key, listing)
        except (NotFound, Aborted, DataLoss):
            self.listings.forget(name)  # the bucket changed under the listing: list again next time
            raise
        finally:
            self._reserved.pop(key, None)

    def too_large(self, key: Key, need: int) -> ResourceExhausted:
        return ResourceExhausted(
            f"model {key[0]!r} version {key[1]} needs {need} bytes, more than the whole "
            f"disk tier (storage.cache_bytes = {self.cap_bytes})"
        )

    def _plan_room(self, key: Key, need: int) -> list[Key]:
        """The versions to evict for ``need`` bytes (pure); ResourceExhausted naming the cap if none can."""
        if need > self.cap_bytes:
            raise self.too_large(key, need)
        old = self._resident.get(key)
        used = self.used_bytes - (old[0] if old else 0)
        order = [k for k in self._resident if k != key]
        victims = plan_eviction(
            self.resident(), order, self.protected(), used, need, self.cap_bytes
        )
        if victims is None:
            raise ResourceExhausted(
                f"disk tier full: model {key[0]!r} version {key[1]} needs {need} bytes and only "
                f"{self.cap_bytes - used} of storage.cache_bytes = {self.cap_bytes} can be freed now; "
                f"the rest is in use by nodes or being downloaded"
            )
        return victims

    async def _evict(self, victims: list[tuple[Key, int]]) -> None:
        """Delete the victims' directories (already out of the index)."""
        for victim, size in victims:
            log.info("disk tier: evicting %s version %d (%d bytes)", *victim, size)
            await asyncio.to_thread(remove, self.path(*victim))
            self.events.evicted(size)

    async def _download(self, key: Key, listing: VersionListing) -> Path:
        began = time.monotonic()
        temp = self.root / PARTIAL / f"{key[0]}.{key[1]}.{secrets.token_hex(4)}"
        try:
            await asyncio.to_thread(temp.mkdir, parents=True)
            await self._run_all([self._object(key, temp, obj) for obj in listing.objects])
            await asyncio.to_thread(write_marker, temp, listing)
            await asyncio.to_thread(self._swap_in, temp, self.path(*key))
        except BaseException:
            await asyncio.shield(asyncio.to_thread(remove, temp))
            raise
        self._resident[key] = (listing.bytes, listing.manifest())
        seconds = time.monotonic() - began
        log.info(
            "disk tier: downloaded %s version %d, %d bytes in %.3f s",
            key[0],
            key[1],
            listing.bytes,
            seconds,
        )
        self.events.downloaded(seconds, listing.bytes)
        return self.path(*key)

    async def _object(self, key: Key, temp: Path, obj: tuple[str, int, str]) -> None:
        rel, size, etag = obj
        dest = temp / rel
        if not dest.resolve().is_relative_to(temp.resolve()):  # belt and braces over safe_relpath
            raise AssertionError(f"{dest} escapes {temp}")
        async with self._gate:
            await self._get(f"{key[0]}/{key[1]}/{rel}", dest, size, etag)

    async def _get(self, key: str, dest: Path, size: int, etag: str) -> None:
        """Object ``key`` into file ``dest`` (its directory made), as listed: ``size`` bytes, ``etag``."""
        try:
            await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, dest) from exc
        written = await self.store.download(key, dest, etag=etag or None)
        if written != size:
            raise DataLoss(f"object {key} in {self.store.url}: downloaded {written} bytes, "
                           f"listed {size} (truncated or changed); nothing was kept")

    @staticmethod
    async def _run_all(jobs: list) -> None:
        """Run ``jobs`` concurrently; on the first failure cancel the rest and raise it."""
        tasks = [asyncio.ensure_future(job) for job in jobs]
        try:
            for done in asyncio.as_completed(tasks):
                await done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _swap_in(temp: Path, final: Path) -> None:
        """Rename ``temp`` to ``final`` atomically; an old copy at ``final`` is moved aside first."""
        final.parent.mkdir(parents=True, exist_ok=True)
        old = None
        if final.exists():
            old = temp.parent / f"{temp.name}.old"
            os.rename(final, old)
        os.rename(temp, final)
        if old is not None:
            remove(old)


def _replace(temp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(temp, final)
