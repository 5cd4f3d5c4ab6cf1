"""What the cache manager and its reloader tell each other, as named operations: health, wake-ups,
requests to evict, drain or recheck, and the futures of the callers waiting on those.

The manager (``tfscache.cache.manager``) asks (``request_evict``, ``request_drain``,
``request_recheck``, ``wake``); the reloader (``tfscache.cache.reloader``) takes the requests
(``take_evictions``, ``take_rechecks``) and answers them (``unloaded``, ``drained``,
``rechecked``). Neither reaches into the other, and no field here is assigned from outside.
"""

from __future__ import annotations

import asyncio
import copy

from tfscache import errors
from tfscache.cache.ledger import Key, Ledger


class Signals:
    """The shared control state of one node's cache; read through properties, changed through
    methods."""

    def __init__(self) -> None:
        self._wake = asyncio.Event()  # the reloader has work
        self._healthy = False
        self._reason = "not started"  # why it is not healthy
        # set while healthy: requests that found the node down wait on it
        self._ready = asyncio.Event()
        self._starting = True  # until the saved models are re-adopted (acquire waits for that)
        # set once the node got this cache's wanted set after start-up
        self._synced = asyncio.Event()
        # the node may serve other than the ledger says: send it the next step
        self._config_stale = False
        self._closed = False
        self._draining = False
        # over a cap with nothing idle to unload: a release must wake the reloader
        self._over_cap = False
        # retired by ``evict`` (with the reason), for the next step
        self._evictions: list[tuple[Key, str]] = []
        self._unload_waiters: dict[Key, list[asyncio.Future]] = {}
        self._drained: list[asyncio.Future] = []
        self._rechecks: list[asyncio.Future] = []  # ``recheck`` callers

    # -- state, read-only ------------------------------------------------------------------

    healthy = property(lambda self: self._healthy)
    reason = property(lambda self: self._reason, doc="Why the cache is not healthy.")
    starting = property(lambda self: self._starting, doc="Until the saved models are re-adopted.")
    config_stale = property(lambda self: self._config_stale)
    closed = property(lambda self: self._closed)
    draining = property(lambda self: self._draining)
    over_cap = property(lambda self: self._over_cap)
    recheck_asked = property(lambda self: bool(self._rechecks), doc="A ``recheck`` caller waits.")

    # -- health and lifecycle ----------------------------------------------------------------

    def starting_because(self, reason: str) -> None:
        """Not healthy yet, and why (the reloader waits for the node)."""
        self._reason = reason

    def set_health(self, healthy: bool, reason: str = "") -> None:
        self._healthy = healthy
        self._reason = reason
        if healthy:
            self._ready.set()
        else:
            self._ready.clear()

    def started(self) -> None:
        """The saved models were re-adopted: healthy, and acquires no longer wait for start-up."""
        self._starting = False
        self.set_health(True)

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def close(self, reason: str) -> None:
        """The manager stopped: unhealthy for good; ``wait_ready`` callers wake and see it
        closed."""
        self._closed = True
        self.set_health(False, reason)
        self._ready.set()

    def config_sent(self) -> None:
        """The node got the wanted set (after start-up, or a recovery)."""
        self._config_stale = False
        self._synced.set()

    def mark_config_stale(self) -> None:
        """The node may serve other than the ledger says: the next step sends the wanted set."""
        self._config_stale = True

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def set_over_cap(self, over: bool) -> None:
        """Over a cap with nothing idle to unload (the next release must wake the reloader)."""
        self._over_cap = over

    # -- wake-ups --------------------------------------------------------------------------

    def wake(self) -> None:
        """The reloader has work."""
        self._wake.set()

    async def wait_for_work(self, timeout: float | None) -> None:
        """Wait until woken (or ``timeout`` s), and clear the wake-up for the next wait."""
        if not self._wake.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
        self._wake.clear()

    # -- requests and their answers --------------------------------------------------------

    def request_evict(self, key: Key, reason: str = "admin") -> asyncio.Future:
        """``evict`` retired ``key`` (for ``reason``: ``admin``, or ``out_of_memory``): the
        reloader unloads it; the future is done once it is gone."""
        future = asyncio.get_running_loop().create_future()
        self._evictions.append((key, reason))
        self._unload_waiters.setdefault(key, []).append(future)
        return future

    def take_evictions(self) -> list[tuple[Key, str]]:
        """The keys ``request_evict`` asked for since the last call, each with its reason."""
        keys, self._evictions = self._evictions, []
        return keys

    def unloaded(self, key: Key) -> None:
        """``key`` left the node (or the ledger): whoever waited for its eviction is done."""
        for future in self._unload_waiters.pop(key, []):
            if not future.done():
                future.set_result(None)

    def request_drain(self) -> asyncio.Future:
        """Refuse new acquires from now on; the future is done once the node holds nothing."""
        self._draining = True
        future = asyncio.get_running_loop().create_future()
        self._drained.append(future)
        self.wake()
        return future

    def drained(self) -> None:
        done(self._drained)
        self._drained = []

    def request_recheck(self) -> asyncio.Future:
        """The node may have lost resident models; the future is done once the reloader checked."""
        future = asyncio.get_running_loop().create_future()
        self._rechecks.append(future)
        self.wake()
        return future

    def take_rechecks(self) -> list[asyncio.Future]:
        waiters, self._rechecks = self._rechecks, []
        return waiters

    def rechecked(self) -> None:
        """The node has its wanted set again: every ``recheck`` caller is done."""
        done(self.take_rechecks())

    def fail_all(self, ledger: Ledger, error: errors.TfscacheError) -> None:
        """Every caller waiting on anything gets ``error`` (the node is down or the cache
        stopped)."""
        fail(ledger.take_waiters(), error)
        for waiters in self._unload_waiters.values():
            fail(waiters, error)
        self._unload_waiters.clear()
        fail(self._drained, error)
        self._drained = []
        fail(self.take_rechecks(), error)


def copy_error(error: errors.TfscacheError) -> errors.TfscacheError:
    """A fresh instance for each caller, so tracebacks do not pile up on one object (with the
    same attributes: a NOT_FOUND keeps its facts for the kind to word it)."""
    fresh = copy.copy(error)
    fresh.__traceback__ = fresh.__cause__ = fresh.__context__ = None
    return fresh


def fail(waiters: list[asyncio.Future], error: errors.TfscacheError) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_exception(copy_error(error))


def done(waiters: list[asyncio.Future]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
