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

A flat model (``flat_file``, the settings file of a kind whose models may have no version folder:
MLServer's ``model-settings.json``) is one version, ``FLAT_VERSION``, downloaded into ROOT/NAME
itself, as the bucket lays it out (``tfscache.storage.layout``); ``flat_settings`` copies its
settings file alone, so that its version's name is known before the model is downloaded.
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

from tfscache.errors import (Aborted, DataLoss, FailedPrecondition, NotFound, ResourceExhausted,
                             Unavailable)
from tfscache.storage.base import ObjectStore, TierEvents, disk_error, settled
from tfscache.storage.layout import (
    FLAT_COPIES,
    FLAT_VERSION,
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
        flat_file: str = "",
    ) -> None:
        """``in_use(key)``: what the nodes do with that version now, as states of their caches'
        ledgers ("loading", "available", "unloading"; empty: nothing). A version in use is never
        evicted; one a node serves ("available", "unloading") is never replaced either.
        ``rescan_s``, ``list_rate``, ``list_active_s``: the listings' (``Listings``). ``flat_file``:
        a model whose directory in the bucket holds it is flat (module docstring; "": none is)."""
        self.root, self.cap_bytes, self.store = Path(root), cap_bytes, store
        self.flat_file = flat_file
        self.rescan_s = rescan_s
        self.in_use = in_use or (lambda key: set())
        self.events = events or TierEvents()
        self.listings = Listings(store, interval_s=rescan_s, rate=list_rate, active_s=list_active_s,
                                 on_disk=self._on_disk, flat_file=flat_file)
        self._local_files: dict[tuple[str, str], tuple[int, str]] = {}  # ... and the copies on disk
        self._file_flights: dict[str, asyncio.Future] = {}
        # flat settings files copied to ROOT/.flat: (size, etag)
        self._flat_copies: dict[str, tuple[int, str]] = {}
        self._flat_flights: dict[str, asyncio.Future] = {}
        self._gate = asyncio.Semaphore(parallel)
        # LRU first; (bytes, manifest, flat)
        self._resident: OrderedDict[Key, tuple[int, dict, bool]] = OrderedDict()
        self._reserved: dict[Key, int] = {}
        self._flights: dict[Key, asyncio.Future] = {}

    async def start(self) -> None:
        """Adopt the complete versions on disk (oldest marker first in LRU order) and remove partial
        ones. Over the cap (it was lowered), nothing is deleted yet: which versions the nodes serve is
        known only once the caches re-adopted them, so the next download makes the room."""
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        for key, manifest, _, flat in sorted(
            await asyncio.to_thread(scan, self.root, self.flat_file), key=lambda a: a[2]
        ):
            self._resident[key] = (sum(size for size, _ in manifest.values()), manifest, flat)
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
        return sum(entry[0] for entry in self._resident.values()) + sum(self._reserved.values())

    def resident(self) -> dict[Key, int]:
        """Complete versions on disk and their bytes, least recently used first."""
        return {key: entry[0] for key, entry in self._resident.items()}

    @property
    def downloads_in_flight(self) -> int:
        return len(self._flights)

    def describe(self) -> dict:
        """The tier in ``/status`` and ``tfscache status``."""
        return {"url": self.store.url, "directory": str(self.root), "bytes": self.used_bytes,
                "cap_bytes": self.cap_bytes, "versions": len(self._resident),
                "downloads_in_flight": self.downloads_in_flight, "in_use": len(self.protected()),
                "lists": self.listings.describe()}

    def path(self, name: str, version: int, flat: bool = False) -> Path:
        """Where a version lives in the tier: ROOT/NAME/VERSION, a flat model's ROOT/NAME."""
        model = self.root / check_name(name)
        return model if flat else model / str(version)

    def has_flat(self, name: str) -> bool:
        """Whether a flat model's copy of ``name`` is on disk."""
        resident = self._resident.get((name, FLAT_VERSION))
        return resident is not None and resident[2]

    def location(self, name: str, version: int) -> Path:
        """``path`` of the version's copy on disk, else as the model's last listing lays it out."""
        resident = self._resident.get((name, version))
        if resident is not None:
            return self.path(name, version, resident[2])
        listing = (self.listed(name) or {}).get(version)
        return self.path(name, version, listing is not None and listing.flat)

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
                tuple(sorted((rel, size, etag) for rel, (size, etag) in manifest.items())), flat
            )
            for (n, v), (_, manifest, flat) in self._resident.items()
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

    async def flat_settings(self, name: str) -> Path:
        """A local copy of flat model ``name``'s settings file as last listed (NotFound if the model
        is not flat): its copy on disk if current, else one in ROOT/.flat/NAME (a GET per change).
        With the store unreachable, the copy on disk (or Unavailable)."""
        on_disk = self.path(name, FLAT_VERSION, True) / self.flat_file
        try:
            listing = (await self.versions(name)).get(FLAT_VERSION)
        except Unavailable:
            if not self.has_flat(name):
                raise
            return on_disk
        listed = listing.manifest().get(self.flat_file) if listing and listing.flat else None
        if listed is None:
            raise NotFound(f"model {name!r} in {self.store.url} has no {self.flat_file}")
        resident = self._resident.get((name, FLAT_VERSION))
        if resident is not None and resident[2] and resident[1].get(self.flat_file) == listed:
            return on_disk  # the downloaded model's own
        copy = self.root / FLAT_COPIES / name / self.flat_file
        if self._flat_copies.get(name) != tuple(listed):
            await self._single(self._flat_flights, name, self._copy_flat(name, copy, *listed))
        return copy

    async def _copy_flat(self, name: str, copy: Path, size: int, etag: str) -> None:
        temp = self.root / PARTIAL / f"{name}.{secrets.token_hex(4)}.file"
        try:
            await self._get(f"{name}/{self.flat_file}", temp, size, etag)
            await asyncio.to_thread(_replace, temp, copy)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(remove, temp))
            raise
        self._flat_copies[name] = (size, etag)

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
            return self.location(*key)
        if listing is None:
            raise NotFound(f"version {version} of model {name!r} not found in {self.store.url}")
        await self._drop_other_layout(name, listing.flat)  # before model files land in ROOT/NAME
        await self.sync_model_files(name)
        resident = self._resident.get(key)
        if resident is not None and resident[2] == listing.flat and (
                resident[1] == listing.manifest()
                or self.in_use(key) - LOADERS):  # a node serves that copy: keep it
            self.events.hit()
            return self.path(*key, listing.flat)
        self.events.miss()
        for rel, _, _ in listing.objects:
            safe_relpath(rel, self.store.url)
        victims = self._plan_room(key, listing.bytes)
        self._reserved[key] = listing.bytes  # before any await: the next plan counts it
        evicted = [(victim, self._resident.pop(victim)) for victim in victims]
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

    async def _evict(self, victims: list[tuple[Key, tuple[int, dict, bool]]]) -> None:
        """Delete the victims' directories (already out of the index; with their index entries)."""
        for victim, (size, _, flat) in victims:
            log.info("disk tier: evicting %s version %d (%d bytes)", *victim, size)
            await asyncio.to_thread(remove, self.path(*victim, flat))
            self.events.evicted(size)

    async def _drop_other_layout(self, name: str, flat: bool) -> None:
        """Evict the copies of ``name`` laid out otherwise than its listing now (it turned flat, or
        got version folders, in the bucket): they share ROOT/NAME. FailedPrecondition while a node
        uses one of them (the cache unloads it once the listing says it vanished)."""
        other = [k for k, entry in self._resident.items() if k[0] == name and entry[2] != flat]
        if not other:
            return
        if any(self.in_use(key) for key in other):
            raise FailedPrecondition(
                f"model {name!r} in {self.store.url} changed its layout (flat or version folders) "
                f"while a node uses its old copy; it can be downloaded once the node let go of it")
        await self._evict([(key, self._resident.pop(key)) for key in other])

    async def _download(self, key: Key, listing: VersionListing) -> Path:
        began = time.monotonic()
        part = "flat" if listing.flat else key[1]
        temp = self.root / PARTIAL / f"{key[0]}.{part}.{secrets.token_hex(4)}"
        try:
            await settled(temp.mkdir, parents=True)
            folder = listing.folder or key[1]
            prefix = key[0] if listing.flat else f"{key[0]}/{folder}"  # of the objects' keys
            await self._run_all([self._object(prefix, temp, obj) for obj in listing.objects])
            await asyncio.to_thread(write_marker, temp, listing)
            await asyncio.to_thread(self._swap_in, temp, self.path(*key, listing.flat))
        except BaseException:
            await asyncio.shield(asyncio.to_thread(remove, temp))
            raise
        self._resident[key] = (listing.bytes, listing.manifest(), listing.flat)
        seconds = time.monotonic() - began
        log.info(
            "disk tier: downloaded %s version %d, %d bytes in %.3f s",
            key[0],
            key[1],
            listing.bytes,
            seconds,
        )
        self.events.downloaded(seconds, listing.bytes)
        return self.path(*key, listing.flat)

    async def _object(self, prefix: str, temp: Path, obj: tuple[str, int, str]) -> None:
        rel, size, etag = obj
        dest = temp / rel
        if not dest.resolve().is_relative_to(temp.resolve()):  # belt and braces over safe_relpath
            raise AssertionError(f"{dest} escapes {temp}")
        async with self._gate:
            await self._get(f"{prefix}/{rel}", dest, size, etag)

    async def _get(self, key: str, dest: Path, size: int, etag: str) -> None:
        """Object ``key`` into file ``dest`` (its directory made), as listed: ``size`` bytes, ``etag``."""
        try:
            await settled(dest.parent.mkdir, parents=True, exist_ok=True)
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
