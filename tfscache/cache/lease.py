"""A lease: a request's hold on a resident model version; a leased version is never unloaded."""

from __future__ import annotations

from collections.abc import Callable

from tfscache.cache.ledger import Key


class Lease:
    """A hold on a resident model version; release it when the request is done."""

    __slots__ = ("name", "version", "_release", "_released", "prefetched")

    def __init__(self, release: Callable[[Key], None], key: Key, prefetched: bool = False) -> None:
        self.name, self.version = key
        self._release = release
        self._released = False
        self.prefetched = prefetched  # the first request of a version a prefetch loaded (docs/prefetch.md)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._release((self.name, self.version))

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, {self.version})"
