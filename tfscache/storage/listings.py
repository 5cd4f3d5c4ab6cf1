"""The bucket's listing of each model, kept fresh off the request path (stale-while-revalidate).

    listings = Listings(store, interval_s=1.0, rate=20, active_s=600, on_disk=tier_versions)
    await listings.start()                       # the background refresher
    await listings.versions("m")                 # {version: VersionListing}: never waits for a LIST
                                                 # when a listing (or a copy on disk) answers
    listings.last("m"), listings.files("m")      # the last listing / the model's own files in it
    await listings.stop()

A request never waits for a LIST when the model was listed before, or the tier holds a complete
version of it: it gets that listing (or the versions on disk), and a refresh of the model is
queued if the listing is older than ``interval_s``. It lists at once only for a model with
neither, or for a version the listing lacks whose listing is older than ``interval_s`` (it may
have just been uploaded).

The refresher re-lists, in the background, every model asked for within ``active_s`` before
its listing is ``interval_s`` old, and the models whose refresh a request queued, at most
``rate`` LISTs a second in all (the stalest first): so a new version of a model in use shows
within ``interval_s`` (plus one LIST), a vanished or changed one is seen as soon, and a model
idle longer than ``active_s`` costs no LIST at all until it is asked for again. With
``interval_s`` 0 nothing is reused: every call lists (no refresher).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tfscache.errors import TfscacheError
from tfscache.storage.base import ObjectStore
from tfscache.storage.layout import VersionListing, group_versions, model_files
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.storage.listings")

Versions = dict[int, VersionListing]


class Listings:
    def __init__(self, store: ObjectStore, *, interval_s: float = 1.0, rate: float = 20.0,
                 active_s: float = 600.0, on_disk: Callable[[str], Versions] | None = None,
                 flat_file: str = "") -> None:
        """``on_disk(name)``: the complete versions of ``name`` in the tier, as listings (answers a
        model never listed since start-up). ``flat_file``: a listing holding ``NAME/FLAT_FILE`` is
        a flat model's (``layout.group_versions``)."""
        self.store, self.interval_s, self.rate, self.active_s = store, interval_s, rate, active_s
        self.flat_file = flat_file
        self.on_disk = on_disk or (lambda name: {})
        # LISTs a caller waited for (requests: a model with neither listing nor copy)
        self.waited = 0
        self.refreshed = 0  # LISTs by the refresher
        self._listings: dict[str, tuple[float, Versions]] = {}
        self._files: dict[str, dict[str, tuple[int, str]]] = {}
        self._asked: dict[str, float] = {}  # model -> when a request last asked for it
        self._queued: set[str] = set()  # refreshes asked for by requests
        self._retry_at: dict[str, float] = {}  # a failed refresh is retried after interval_s
        self._flights: dict[str, asyncio.Future] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self, models: list[str] = ()) -> None:
        """Run the refresher; ``models`` (those with versions on disk) are listed soon."""
        for name in models:
            self._queued.add(name)
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._refresher(), name="tfscache-listings")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel(task)
        for flight in list(self._flights.values()):
            flight.cancel()

    # --- what requests call ---

    async def versions(self, name: str, need: int | None = None) -> Versions:
        """The model's versions as last listed (a refresh queued when older than ``interval_s``), or
        on disk; listed now only when neither answers (``need``: the version the caller wants)."""
        now = time.monotonic()
        self._asked[name] = now
        cached = self._listings.get(name)
        if self.interval_s <= 0:
            return await self._wait(name)
        if cached is not None:
            stale = now - cached[0] >= self.interval_s
            if need is None or need in cached[1] or not stale:
                if stale:
                    self._queue(name)
                return cached[1]
            return await self._wait(name)  # a version not in an old listing: it may be new
        disk = self.on_disk(name)
        if disk and (need is None or need in disk):
            self._queue(name)
            return disk
        return await self._wait(name)

    async def _wait(self, name: str) -> Versions:
        self.waited += 1
        return await self.list_now(name)

    def last(self, name: str) -> Versions | None:
        """The model's last listing however old, without listing; None if never listed."""
        cached = self._listings.get(name)
        return cached[1] if cached is not None else None

    def files(self, name: str) -> dict[str, tuple[int, str]] | None:
        """The model's own files (rel -> (size, etag)) in its last listing; None if never listed."""
        return self._files.get(name)

    def describe(self) -> dict:
        """For ``/status``: LISTs callers waited for, LISTs in the background, models kept fresh."""
        return {
            "on_request": self.waited,
            "background": self.refreshed,
            "active_models": len(self._asked),
        }

    def forget(self, name: str) -> None:
        """The bucket changed under the listing (an object gone or changed): list before next use."""
        self._listings.pop(name, None)

    async def list_now(self, name: str) -> Versions:
        """List ``name/`` (one LIST however many ask at once)."""
        flight = self._flights.get(name)
        if flight is None:
            flight = self._flights[name] = asyncio.ensure_future(self._list(name))
            flight.add_done_callback(
                lambda f: self._flights.pop(name, None) if self._flights.get(name) is f else None
            )
        return await asyncio.shield(flight)

    async def _list(self, name: str) -> Versions:
        objects = await self.store.list(name + "/")
        found = group_versions(name, objects, self.flat_file)
        self._files[name] = model_files(name, objects, self.flat_file)
        self._listings[name] = (time.monotonic(), found)
        self._retry_at.pop(name, None)
        return found

    # --- the refresher ---

    def _queue(self, name: str) -> None:
        if name not in self._queued and name not in self._flights:
            self._queued.add(name)
            self._wake.set()

    def due(self, now: float) -> list[str]:
        """The models to list now, stalest first: those a request queued, and those asked for within
        ``active_s`` whose listing turns ``interval_s`` old within the next tick (pure but for reading).
        """
        soon = self.interval_s - self.tick
        for name, asked in list(self._asked.items()):
            if now - asked > self.active_s:
                del self._asked[name]  # idle: no LIST until it is asked for again
            elif name in self._listings and now - self._listings[name][0] >= soon:
                self._queued.add(name)
        ready = [
            n for n in self._queued if n not in self._flights and self._retry_at.get(n, 0) <= now
        ]
        return sorted(ready, key=lambda n: self._listings.get(n, (float("-inf"),))[0])

    @property
    def tick(self) -> float:
        return max(self.interval_s / 4, 0.01)

    async def _refresher(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.tick)
            except TimeoutError:
                pass
            self._wake.clear()
            for name in self.due(time.monotonic()):
                self._queued.discard(name)
                if name in self._flights:
                    continue
                self.refreshed += 1
                task = asyncio.ensure_future(self.list_now(name))
                task.add_done_callback(lambda f, n=name: self._refreshed(n, f))
                await asyncio.sleep(1 / self.rate)  # at most ``rate`` LISTs a second

    def _refreshed(self, name: str, task: asyncio.Future) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        # not at ``rate`` while the store is down
        self._retry_at[name] = time.monotonic() + self.interval_s
        message = error.message if isinstance(error, TfscacheError) else repr(error)
        log.warning(
            "refreshing the listing of %s in %s failed (the last one is used meanwhile): %s",
            name,
            self.store.url,
            message,
        )
