"""What the cache manager and its reloader tell each other: health, wake-ups, requests to evict,
drain or recheck, and the futures of the callers waiting on those.

The manager (``tfscache.cache.manager``) records requests here and wakes the reloader;
the reloader (``tfscache.cache.reloader``) answers them. Neither reaches into the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tfscache import errors
from tfscache.cache.ledger import Entry, Key, Ledger


class Signals:
    """The shared control state of one node's cache."""

    def __init__(self, lease: Callable[[Entry], object], save: Callable[[], None],
                 pin: Callable[..., Awaitable[object]]) -> None:
        self.lease = lease  # a new Lease on a READY entry (the manager's)
        self.save = save  # have the state file written soon
        self.pin = pin  # the manager's pin: load and pin again what the node lost
        self.repins: set[asyncio.Task] = set()
        self.lost_pins: dict[Key, object] = {}  # pinned in the state file, the node lost them: being pinned again
        self.wake = asyncio.Event()  # the reloader has work
        self.healthy = False
        self.reason = "not started"  # why it is not healthy
        self.ready = asyncio.Event()  # set while healthy: requests that found the node down wait on it
        self.starting = True  # until the saved models are re-adopted (acquire waits for that)
        self.synced = asyncio.Event()  # set once the node got this cache's wanted set after start-up
        self.config_stale = False  # the node may serve other than the ledger says: send it next step
        self.closed = False
        self.draining = False
        self.over_cap = False  # over a cap with nothing idle to unload: a release must wake the reloader
        self.evict_queue: list[Key] = []  # marked UNLOADING by ``evict``, for the next step
        self.unload_waiters: dict[Key, list[asyncio.Future]] = {}
        self.drained: list[asyncio.Future] = []
        self.resync: list[asyncio.Future] = []  # ``recheck`` callers

    def set_health(self, healthy: bool, reason: str = "") -> None:
        self.healthy = healthy
        self.reason = reason
        if healthy:
            self.ready.set()
        else:
            self.ready.clear()

    def fail_all(self, ledger: Ledger, error: errors.TfscacheError) -> None:
        """Every caller waiting on anything gets ``error`` (the node is down or the cache stopped)."""
        for pending in ledger.pending.values():
            fail(pending.waiters, error)
        ledger.pending.clear()
        for entry in ledger.entries.values():
            fail(entry.waiters, error)
            entry.waiters = []
        for waiters in self.unload_waiters.values():
            fail(waiters, error)
        self.unload_waiters.clear()
        fail(self.drained, error)
        self.drained = []
        fail(self.resync, error)
        self.resync = []


def copy_error(error: errors.TfscacheError) -> errors.TfscacheError:
    """A fresh instance for each caller, so tracebacks do not pile up on one object."""
    return type(error)(error.message)


def fail(waiters: list[asyncio.Future], error: errors.TfscacheError) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_exception(copy_error(error))
