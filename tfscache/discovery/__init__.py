"""Cluster membership for sidecar mode: which tfscache sidecars are on the ring.

One ``Discovery`` object per sidecar. Its life:

    discovery = make_discovery("consul", address="http://127.0.0.1:8500", ttl_s=10)
    discovery.subscribe(topology.set_peers)     # called with list[Peer] on every change
    await discovery.start()                     # first membership read (or DiscoveryError)
    await discovery.register(Peer("a", "10.0.0.1:8500", "10.0.0.1:8501"))
    ...                                         # discovery.members(): last known healthy set
    await discovery.deregister()                # on shutdown / drain: leave the ring
    await discovery.stop()

Implementations are picked by name from ``BACKENDS`` (tfscache.discovery.table: one row each,
the module imported only when chosen):

* ``static``: the peer list of the config file; ``reload()`` re-reads it (SIGHUP).
* ``consul``: an agent's HTTP API: service registration with a TTL check kept alive,
  blocking queries on ``/v1/health/service/<name>?passing``.
* ``etcd``: etcd v3's JSON gateway: a key under a lease kept alive, a watch on the prefix.
* ``dns``: a (headless Kubernetes) Service's SRV or A/AAAA records, re-resolved on an interval;
  nothing registers (the records follow the pods' readiness).

The one promise every backend keeps: a discovery failure never shrinks the
membership. On errors the last known membership stays, the backend retries with
capped exponential back-off, and it logs once per change of state (ok -> failing,
failing -> ok), not once per attempt. A read that comes back empty is not applied
either: this sidecar registered itself, so an empty healthy set means the registry
lost its state, not that every sidecar died.

Nor does an outage shrink it after the fact. While this sidecar cannot renew its own
registration (its keep-alive fails, or finds its lease expired), the registry is probably
expiring the others' registrations in the same outage, and the deletions arrive in a burst
when it is reachable again. Backends then call ``_hold_removals(ttl)``: until ``ttl`` after
the last such failure a read that drops members keeps them (additions apply at once), and
at the end of the hold the latest read is applied as it is. A sidecar that really died in
the outage leaves the ring one TTL late; one that re-registered never leaves it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfscache.discovery.peer import Peer, parse_peers
from tfscache.discovery.table import BACKENDS, COMMON_OPTIONS
from tfscache.importer import load
from tfscache.tasks import cancel

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "BACKENDS",
    "Backoff",
    "Discovery",
    "DiscoveryError",
    "Peer",
    "advertise_peer",
    "describe_error",
    "from_settings",
    "make_discovery",
    "parse_peers",
]

log = logging.getLogger("tfscache.discovery")

Listener = Callable[[list[Peer]], "Awaitable[None] | None"]


class DiscoveryError(Exception):
    """Discovery could not do what was asked (start-up read, registration) within its deadline."""


class Backoff:
    """Capped exponential back-off with jitter: ``initial``, x2 per failure, at most ``cap`` seconds."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0) -> None:
        self.initial, self.cap = initial, cap
        self.failures = 0

    def next_delay(self) -> float:
        """The delay before the next attempt (counts one more failure)."""
        delay = min(self.cap, self.initial * (2 ** min(self.failures, 30)))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


class StateLog:
    """Logs an activity's ok -> failing and failing -> ok transitions, once each.

    ``what`` is a string or a callable returning one (so it can name the sidecar once registered).
    """

    def __init__(self, logger: logging.Logger, what: str | Callable[[], str]) -> None:
        self.logger, self._what = logger, what
        self.failing_since: float | None = None
        self.attempts = 0

    @property
    def what(self) -> str:
        return self._what() if callable(self._what) else self._what

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failed(self, error: object) -> None:
        self.attempts += 1
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            self.logger.warning(
                "%s failing: %s; keeping the last known membership, retrying with back-off",
                self.what,
                error,
            )

    def ok(self) -> None:
        if self.failing_since is not None:
            self.logger.info("%s recovered after %.1f s and %d failed attempt(s)", self.what,
                             time.monotonic() - self.failing_since, self.attempts)
        self.failing_since, self.attempts = None, 0


def describe_error(exc: BaseException) -> str:
    """``Type: message`` (or just the type when the message is empty, as for timeouts)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _key(peers: Iterable[Peer]) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((p.name, p.grpc, p.rest) for p in peers))


class Discovery(ABC):
    """Membership of one sidecar's cluster. Subclasses fill in the five coroutines."""

    name = ""
    # Non-empty for backends where this sidecar registers nothing (static, dns): what
    # ``tfscache join`` answers there, and such a sidecar is on its own ring from the start.
    registration_note = ""

    def __init__(self, *, start_timeout_s: float = 30.0, retry_initial_s: float = 0.1,
                 retry_max_s: float = 5.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.retry_initial_s, self.retry_max_s = retry_initial_s, retry_max_s
        self._members: list[Peer] = []
        self._listeners: list[Listener] = []
        self._known = asyncio.Event()   # set by the first successful read
        self._changed = asyncio.Condition()
        self._notify_lock = asyncio.Lock()
        self.label = ""  # this sidecar's name once registered, for log lines
        self._states: list[StateLog] = []
        self._empty_log = self._state_log("membership read (empty result ignored)")
        self._hold_until = 0.0  # monotonic: until then a read that drops members keeps them
        self._latest: list[Peer] | None = None  # the last read as it came (removals not held back)
        self._release_task: asyncio.Task | None = None

    # -- the interface -------------------------------------------------------------------

    @abstractmethod
    async def start(self) -> None:
        """Read the membership once and start following it; DiscoveryError after ``start_timeout_s``."""

    @abstractmethod
    async def register(self, peer: Peer) -> None:
        """Put this sidecar in the membership and keep it there until ``deregister``."""

    @abstractmethod
    async def deregister(self) -> None:
        """Take this sidecar out of the membership (best effort, bounded by a deadline)."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop following the membership and release connections (does not deregister)."""

    @property
    def failing(self) -> bool:
        """True while any of this object's activities (watch, keep-alive, reads) is failing."""
        return any(state.failing for state in self._states)

    def activities(self) -> dict[str, tuple[bool, int]]:
        """Each activity's description -> (failing now, failed attempts since it last succeeded)."""
        return {state.what: (state.failing, state.attempts) for state in self._states}

    async def reload(self) -> bool:
        """Re-read a file-based membership (the SIGHUP handler calls this); a no-op for registries."""
        return True

    def members(self) -> list[Peer]:
        """The last known healthy set, sorted by name (a copy)."""
        return list(self._members)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(members)`` (plain or async) after each change; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def wait_for(self, predicate: Callable[[list[Peer]], bool], timeout: float) -> list[Peer]:
        """Wait until ``predicate(members)`` holds; asyncio.TimeoutError after ``timeout`` seconds."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: predicate(self.members())), timeout
            )
        return self.members()

    # -- for subclasses ------------------------------------------------------------------

    async def _apply(self, peers: Iterable[Peer]) -> None:
        """A successful read of the whole membership: record it and tell listeners if it changed."""
        peers = sorted(peers, key=lambda p: p.name)
        if not peers and self._members:
            self._empty_log.failed("the registry reports no healthy sidecar at all")
            return
        self._empty_log.ok()
        self._known.set()
        self._latest = peers
        names = {p.name for p in peers}
        held = (
            [p for p in self._members if p.name not in names]
            if time.monotonic() < self._hold_until
            else []
        )
        if held:
            log.info(
                "%s discovery%s: holding %s on the ring until %.1f s after this sidecar's registration "
                "works again (their registrations may have lapsed in the same outage)",
                self.name,
                f" ({self.label})" if self.label else "",
                ", ".join(p.name for p in held),
                self.hold_removals_s,
            )
            peers = sorted([*peers, *held], key=lambda p: p.name)
            if self._release_task is None or self._release_task.done():
                self._release_task = asyncio.create_task(
                    self._release_held(), name=f"{self.name}-release"
                )
        if _key(peers) == _key(self._members):
            return
        self._members = peers
        log.info(
            "%s discovery%s: membership %s",
            self.name,
            f" ({self.label})" if self.label else "",
            ", ".join(p.name for p in peers) or "(none)",
        )
        async with self._changed:
            self._changed.notify_all()
        async with self._notify_lock:  # listeners see changes in order, one at a time
            if _key(peers) != _key(self._members):
                return  # superseded while waiting; the newer change notifies
            for listener in list(self._listeners):
                try:
                    result = listener(list(peers))
                    if inspect.isawaitable(result):
                        await result
                except Exception:  # noqa: BLE001 - a listener's bug must not stop discovery
                    log.exception("discovery listener %r failed", listener)

    hold_removals_s = 0.0  # set by _hold_removals: how long the last hold lasts (for the log line)

    def _hold_removals(self, seconds: float) -> None:
        """This sidecar could not renew its own registration: hold back removals until ``seconds``
        from now."""
        self.hold_removals_s = seconds
        self._hold_until = max(self._hold_until, time.monotonic() + seconds)

    async def _release_held(self) -> None:
        """At the end of the hold, apply the latest read as it came."""
        while (wait := self._hold_until - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        if self._latest is not None:
            await self._apply(self._latest)

    async def _stop_release(self) -> None:
        await cancel(self._release_task)
        self._release_task = None

    async def _wait_known(self) -> None:
        try:
            await asyncio.wait_for(self._known.wait(), self.start_timeout_s)
        except asyncio.TimeoutError:
            raise DiscoveryError(f"{self.name} discovery: no membership read within "
                                 f"{self.start_timeout_s} s") from None

    def _state_log(self, activity: str, logger: logging.Logger = log) -> StateLog:
        state = StateLog(
            logger,
            lambda: f"{self.name} discovery{' (' + self.label + ')' if self.label else ''}: "
            f"{activity}",
        )
        self._states.append(state)
        return state

    def _backoff(self) -> Backoff:
        return Backoff(self.retry_initial_s, self.retry_max_s)


class WatchingDiscovery(Discovery):
    """A backend that follows a remote registry: one HTTP session, a watch task, a keep-alive task.

    Subclasses implement ``_watch()`` (runs until cancelled, applying what it reads) and
    start ``self._keepalive_task`` when they register.
    """

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self._session: aiohttp.ClientSession | None = None
        self._watch_task: asyncio.Task | None = None
        self._keepalive_task: asyncio.Task | None = None

    @abstractmethod
    async def _watch(self) -> None:
        """Follow the registry until cancelled, calling ``_apply`` on every change."""

    async def start(self) -> None:
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(self._watch(), name=f"{self.name}-watch")
        await self._wait_known()

    async def stop(self) -> None:
        await cancel(self._keepalive_task)
        await cancel(self._watch_task)
        await self._stop_release()
        self._keepalive_task = self._watch_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_discovery(name: str, **options) -> Discovery:
    """A new Discovery by its name in ``BACKENDS``; ValueError names the known ones."""
    factories = {known: row.factory for known, row in BACKENDS.items()}
    return load(factories, name, "discovery backend")(**options)


def from_settings(settings: Any, config_file: str | Path | None = None) -> Discovery:
    """The Discovery that ``settings.discovery`` describes, its options named by its row.

    ``config_file`` is the TOML file the static backend re-reads on ``reload()``.
    """
    section = settings.discovery
    row, options = BACKENDS.get(section.backend), {}
    if row is not None:  # else make_discovery's ValueError names the known backends
        options = {keyword: getattr(section, name)
                   for keyword, name in {**COMMON_OPTIONS, **row.options}.items()}
        if row.peers_from_ring:
            options.update(peers=list(settings.ring.peers), config_file=config_file or None)
    return make_discovery(section.backend, **options)


def advertise_peer(settings: Any, grpc_port: int, rest_port: int | None) -> Peer:
    """This sidecar as others reach it: ``discovery.advertise_host``, else the bind address, else the FQDN."""
    host = (
        getattr(getattr(settings, "discovery", None), "advertise_host", "")
        or settings.server.bind_address
    )
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return Peer(settings.ring.self_name or "local", f"{host}:{grpc_port}",
                f"{host}:{rest_port}" if rest_port else "",
                getattr(getattr(settings, "node", None), "node_tier", "gpu"))
