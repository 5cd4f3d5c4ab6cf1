"""Per-node cache manager: the only writer of one TF Serving node's ModelServerConfig.

``acquire(name, version)`` returns a ``Lease`` once that version is AVAILABLE on the
node; a model with a lease is never unloaded. A hit takes no lock and awaits nothing.

A cold model joins the pending set; one reloader task (TF Serving serialises reloads
anyway) repeatedly plans a step:

1. order pending models by waiting requests (most first, ties: oldest);
2. admit each while the caps allow, choosing idle victims in the policy's order,
   stopping at the first that cannot fit (it waits for room, up to ``room_timeout_s``);
3. victims leave the config in one reload, and the reloader waits until the node
   reports END for each, so the caps hold at every instant;
4. every admitted model joins the config in one more reload (models that arrived
   while a reload was in flight share the next one), and GetModelStatus, not the
   reload's result, decides which loaded: AVAILABLE hands a lease to each waiter,
   END with an error goes to each waiter and the model leaves the config again.

Hazards of real TF Serving handled here (tfserving-behavior.md §1.4-§1.9): no base
path that vanished is ever sent (it would wedge the node); every RPC has a deadline
and a reload past its deadline marks the node unhealthy; a failed version is
removed from the config (it would otherwise stay sticky) and not retried for
``failure_backoff_s``; a removed-then-re-added model is confirmed by its status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from tfscache import errors
from tfscache.cachestate import CacheState, SavedModel, StateWriter, learned_key, load_state
from tfscache.nodeclient import NodeClient
from tfscache.nodepid import NodeMemory
from tfscache.policy import EvictionPolicy, make_policy
from tfscache.repository import ModelRepository, check_name
from tfscache.wire import serving_pb2 as pb

log = logging.getLogger("tfscache.cache")

Key = tuple[str, int]

LOADING, READY, UNLOADING = "loading", "available", "unloading"


@dataclass
class CacheSettings:
    """Caps and timings of one node's cache."""

    max_models: int = 0
    """Most model versions resident on the node at once (0: no cap)."""
    memory_bytes: int = 0
    """Most bytes of models resident on the node at once (0: no cap)."""
    room_timeout_s: float = 30.0
    """How long a load waits for a busy model to become idle before RESOURCE_EXHAUSTED."""
    failure_backoff_s: float = 30.0
    """After a failed load, requests for that version get the same error for this long."""
    rpc_deadline_s: float = 10.0
    """Deadline of GetModelStatus and of reloads that load nothing."""
    reload_deadline_s: float = 300.0
    """Deadline of a reload that loads models; past it the node is marked unhealthy."""
    health_retry_s: float = 5.0
    """While unhealthy, how often to try the node again."""
    estimate_factor: float = 1.2
    """A model's memory before its first load: this times its size on disk (TF Serving's)."""
    policy: str = "lru"
    """Eviction policy, by its name in tfscache.policy.POLICIES."""
    state_file: Path | None = None
    """Where the node's config is kept across restarts (None: not kept; the node is cleared)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"cache setting {f.name} must not be negative, got {value!r}")
        make_policy(self.policy)  # fails early on an unknown name


class CacheEvents:
    """What a CacheManager reports as it works; these do nothing (tfscache.metrics counts them).

    Called synchronously on the event loop: implementations must not block or raise.
    """

    def hit(self, key: Key) -> None:
        """An acquire found ``key`` resident."""

    def miss(self, key: Key) -> None:
        """An acquire had to wait for ``key``'s load (or was refused it)."""

    def loaded(self, key: Key, seconds: float, size: int, measured: bool) -> None:
        """``key`` is AVAILABLE after a reload of ``seconds``; ``size`` bytes (measured or estimated)."""

    def load_failed(self, key: Key, seconds: float, error: Exception) -> None:
        """Loading ``key`` failed with ``error``."""

    def room_waited(self, key: Key, seconds: float) -> None:
        """``key``'s load waited ``seconds`` for room under the caps (admitted, or timed out)."""

    def evicted(self, key: Key, reason: str, size: int) -> None:
        """``key`` leaves the node's config: capacity, vanished, node_lost, ..."""

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        """The node reported END for ``key``, ``seconds`` after its config went out."""


@dataclass(frozen=True)
class ResidentModel:
    """One entry of ``CacheManager.snapshot()``."""

    name: str
    version: int
    bytes: int
    measured: bool
    leases: int
    last_use: float  # wall-clock seconds
    state: str  # "loading", "available" or "unloading"
    pinned: bool = False  # never chosen as a victim (``CacheManager.pin``)


@dataclass(frozen=True)
class QueuedLoad:
    """One entry of ``CacheManager.queue()``."""

    name: str
    version: int
    waiters: int
    bytes: int
    waiting_for_room: bool


class _Entry:
    """A model version in the node's config (or leaving it)."""

    __slots__ = ("key", "state", "bytes", "disk", "measured", "leases", "last_use", "waiters")

    def __init__(self, key: Key, state: str, size: int, measured: bool, last_use: float,
                 disk: int = 0) -> None:
        self.key = key
        self.disk = disk
        self.state = state
        self.bytes = size
        self.measured = measured
        self.leases = 0
        self.last_use = last_use
        self.waiters: list[asyncio.Future] = []


class _Pending:
    """A cold model version waiting for its turn to load."""

    __slots__ = ("key", "estimate", "disk", "first_seen", "waiters", "blocked_since")

    def __init__(self, key: Key, estimate: int, disk: int, now: float) -> None:
        self.key = key
        self.estimate = estimate
        self.disk = disk
        self.first_seen = now
        self.waiters: list[asyncio.Future] = []
        self.blocked_since: float | None = None

    def live(self) -> list[asyncio.Future]:
        return [w for w in self.waiters if not w.done()]


class Lease:
    """A hold on a resident model version; release it when the request is done."""

    __slots__ = ("name", "version", "_cache", "_released")

    def __init__(self, cache: CacheManager, key: Key) -> None:
        self.name, self.version = key
        self._cache = cache
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache._release((self.name, self.version))

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, {self.version})"


class CacheManager:
    """Owns one node's config: loads on demand, evicts idle models under the caps."""

    def __init__(self, node: NodeClient, repository: ModelRepository, settings: CacheSettings,
                 policy: EvictionPolicy | None = None, node_pid: int | None = None,
                 state_file: Path | None = None, events: CacheEvents | None = None,
                 find_node_pid: Callable[[], int | None] | None = None) -> None:
        self.node = node
        self.events = events or CacheEvents()
        self.repository = repository
        self.settings = settings
        self.policy = policy or make_policy(settings.policy)
        self.policy.set_caps(settings.max_models, settings.memory_bytes)
        self.state_file = state_file if state_file is not None else settings.state_file
        self._writer: StateWriter | None = StateWriter(self.state_file)  # coalesced, in a worker thread
        self._memory = NodeMemory(node_pid, find_node_pid)  # find_node_pid: again when the node is replaced
        self._entries: dict[Key, _Entry] = {}
        self._pending: dict[Key, _Pending] = {}
        self._failed: dict[Key, tuple[float, errors.TfscacheError]] = {}
        self._learned: dict[Key, int] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._healthy = False
        self._unhealthy_reason = "not started"
        self._ready = asyncio.Event()  # set while healthy: requests that found the node down wait on it
        self._resync: list[asyncio.Future] = []  # ``recheck`` callers, for the reloader's next step
        self._config_stale = False  # the node's config may differ from the entries: send it next step
        self._starting = True  # until the saved models are re-adopted (acquire waits for that)
        self._synced = asyncio.Event()  # set once the node got this cache's config after start-up
        self._closed = False
        self._pinned: set[Key] = set()  # kept in the state file
        self._repins: set[asyncio.Task] = set()
        self._evict_queue: list[Key] = []  # evicted by ``evict``, for the reloader's next step
        self._unload_waiters: dict[Key, list[asyncio.Future]] = {}
        self._draining = self._over_cap = False  # over_cap: over a cap with nothing idle to unload
        self._drained: list[asyncio.Future] = []

    # -- public API --------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def start(self) -> None:
        """Start the reloader; it re-adopts what the state file says the node serves, in the background.

        Returns at once. Until the node answered and the saved models were re-adopted the
        cache is not healthy (``wait_ready``): requests wait for it, and a node that is not
        listening yet (a pod whose containers start together) or is busy with a long load
        (this process restarted under it) delays nothing else. The config that clears what
        the node serves beyond the adopted models is sent by the reloader's first step.
        """
        from tfscache import cacheloop  # the reloader's steps; it imports this module

        state = await asyncio.to_thread(load_state, self.state_file)
        self._unhealthy_reason = f"starting: waiting for node {self.node.target} to answer"
        self._task = asyncio.create_task(cacheloop.run(self, state), name=f"tfscache-cache-{self.node.target}")

    async def wait_ready(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` s (None: no limit) until the cache is healthy; whether it is."""
        if self._closed:
            return False
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            pass
        return self._healthy and not self._closed

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the node has been sent this cache's config since start-up (it cleared the rest)."""
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def recheck(self) -> None:
        """The node answered NOT_FOUND for a model held as AVAILABLE: it may have lost its config
        (TF Serving restarted behind a sidecar). The reloader checks each resident model's status
        and, if the node lost any, sends the config again and waits for them; this returns once
        that is done. Concurrent callers share one check, so a restart costs one reload."""
        fut = asyncio.get_running_loop().create_future()
        self._resync.append(fut)
        self._wake.set()
        await fut

    def state_of(self, name: str, version: int) -> str | None:
        """``LOADING``, ``READY`` or ``UNLOADING`` for a version in the node's config, else None."""
        entry = self._entries.get((name, version))
        return entry.state if entry is not None else None

    def failure(self, name: str, version: int) -> errors.TfscacheError | None:
        """The error of the version's last load while requests still get it (``failure_backoff_s``)."""
        failed = self._failed.get((name, version))
        return failed[1] if failed is not None and time.monotonic() < failed[0] else None

    async def stop(self) -> None:
        """Stop loading; waiters get UNAVAILABLE. The node keeps serving; the NodeClient stays open."""
        self._closed = True
        self._set_health(False, "its cache manager stopped")
        self._ready.set()  # wake ``wait_ready`` callers: they see it closed
        for task in self._repins:
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._fail_all(errors.NodeUnavailable(f"cache manager for node {self.node.target} stopped"))
        self._save()
        writer, self._writer = self._writer, None  # nothing is saved after the last write
        if writer is not None:
            await writer.close()

    async def flush_state(self) -> None:
        """Wait until the state file holds every change made so far."""
        if self._writer is not None:
            await self._writer.flush()

    async def acquire(self, name: str, version: int | None = None, timeout: float | None = None) -> Lease:
        """A lease on ``name`` at ``version`` (None: the highest on disk), loading it if needed."""
        if self._starting:  # re-adopting what the node serves: its first answer comes within seconds
            await self.wait_ready(timeout)
        # A hit: no file-system access beyond the remembered latest version, no await.
        latest = version if version is not None else self.repository.latest_version(name)
        entry = self._entries.get((name, latest))
        if entry is not None and entry.state == READY and not self._draining:
            self.events.hit(entry.key)
            return self._lease(entry)
        found = self.repository.resolve(name, version)
        key = (found.name, found.version)
        self.events.miss(key)
        fut = await self._enqueue(key)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except BaseException as exc:
            # A lease granted just as the caller gave up goes straight back.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().release()
            fut.cancel()
            if isinstance(exc, TimeoutError):
                raise errors.DeadlineExceeded(
                    f"Timed out after {timeout} s waiting for model {key[0]} version {key[1]} "
                    f"to load on node {self.node.target}") from None
            raise

    def is_resident(self, name: str, version: int | None = None) -> bool:
        """Whether that version is AVAILABLE here (cheap; for routing to a replica that holds it)."""
        try:
            check_name(name)
            if version is None:
                version = self.repository.latest_version(name)
        except errors.TfscacheError:
            return False
        entry = self._entries.get((name, version))
        return entry is not None and entry.state == READY

    def queue(self) -> list[QueuedLoad]:
        """Cold model versions waiting for a reload, with their waiting requests."""
        return [QueuedLoad(p.key[0], p.key[1], len(p.live()), p.estimate, p.blocked_since is not None)
                for p in self._pending.values()]

    def snapshot(self) -> list[ResidentModel]:
        return [self._describe(e) for e in self._entries.values()]

    # -- admin operations (tfscache.admin) ---------------------------------------------

    @property
    def draining(self) -> bool:
        """True once ``drain`` was called: every new acquire gets UNAVAILABLE."""
        return self._draining

    async def preload(self, name: str, version: int | None = None, timeout: float | None = None) -> ResidentModel:
        """Load ``name`` (version None: the highest on disk) unless resident; errors as ``acquire``'s."""
        lease = await self.acquire(name, version, timeout)
        lease.release()
        return self._resident((lease.name, lease.version))

    async def pin(self, name: str, version: int | None = None, timeout: float | None = None) -> ResidentModel:
        """Load if needed and keep resident: the policy never chooses a pinned version as a victim."""
        lease = await self.acquire(name, version, timeout)
        self._pinned.add((lease.name, lease.version))
        lease.release()
        self._save()
        return self._resident((lease.name, lease.version))

    def unpin(self, name: str, version: int | None = None) -> list[Key]:
        """Make pinned versions of ``name`` (all when ``version`` is None) evictable again."""
        keys = sorted(k for k in self._pinned if k[0] == name and version in (None, k[1]))
        if not keys:
            raise errors.NotFound(f"model {name}{_version(version)} is not pinned on node {self.node.target}")
        self._pinned.difference_update(keys)
        self._save()
        self._wake.set()  # a load may have been waiting for the room the pin held
        return keys

    async def evict(self, name: str, version: int | None = None) -> list[Key]:
        """Unload idle resident versions of ``name`` (all when ``version`` is None) now; wait until gone."""
        check_name(name)
        keys = [k for k, e in self._entries.items() if k[0] == name and version in (None, k[1])
                and e.state != UNLOADING]
        if not keys:
            raise errors.NotFound(f"model {name}{_version(version)} is not resident on node {self.node.target}")
        busy = [self._entries[k] for k in keys if self._entries[k].state != READY or self._entries[k].leases
                or k in self._pinned]
        if busy:
            raise errors.FailedPrecondition(f"not evicting from node {self.node.target}: " + "; ".join(
                f"model {e.key[0]} version {e.key[1]} " + (
                    f"is held by {e.leases} lease{'s' if e.leases != 1 else ''} (requests in flight)"
                    if e.leases else "is loading" if e.state == LOADING else "is pinned (unpin it first)")
                for e in busy))
        futures = []
        for key in keys:
            self._entries[key].state = UNLOADING
            self.policy.forget(key)
            self._evict_queue.append(key)
            futures.append(asyncio.get_running_loop().create_future())
            self._unload_waiters.setdefault(key, []).append(futures[-1])
        self._wake.set()
        await asyncio.gather(*futures)
        return sorted(keys)

    async def drain(self) -> None:
        """Refuse new acquires, let leases and queued loads finish, then unload every model."""
        self._draining = True
        fut = asyncio.get_running_loop().create_future()
        self._drained.append(fut)
        self._wake.set()
        await fut

    def _resident(self, key: Key) -> ResidentModel:
        entry = self._entries.get(key)
        if entry is None:  # evicted between the lease and now: only possible under extreme churn
            raise errors.Aborted(f"model {key[0]} version {key[1]} was unloaded again before it could be reported")
        return self._describe(entry)

    def _describe(self, e: _Entry) -> ResidentModel:
        return ResidentModel(e.key[0], e.key[1], e.bytes, e.measured, e.leases, e.last_use, e.state,
                             e.key in self._pinned)

    # -- acquire / release -------------------------------------------------------------

    def _lease(self, entry: _Entry) -> Lease:
        entry.leases += 1
        entry.last_use = time.time()
        self.policy.record_access(entry.key, time.monotonic())
        return Lease(self, entry.key)

    def _release(self, key: Key) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.leases -= 1
        if entry.leases == 0 and (self._pending or self._draining or self._over_cap):
            self._wake.set()  # a load may be waiting for room, or the caps for a victim

    async def _enqueue(self, key: Key) -> asyncio.Future:
        """A future for a lease on cold ``key``, joined to its load (one load per key)."""
        self._check_loadable(key)
        estimate = disk = 0
        entry = self._entries.get(key)
        if key not in self._pending and (entry is None or entry.state == UNLOADING):
            estimate, disk = await asyncio.to_thread(self._estimate, key)  # walks the version directory
            self._check_loadable(key)  # re-check after the await
        entry = self._entries.get(key)
        fut = asyncio.get_running_loop().create_future()
        if entry is not None and entry.state == READY:
            fut.set_result(self._lease(entry))
        elif entry is not None and entry.state == LOADING:
            entry.waiters.append(fut)
        else:
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = _Pending(key, estimate, disk, time.monotonic())
            pending.waiters.append(fut)
            self._wake.set()
        return fut

    def _check_loadable(self, key: Key) -> None:
        if self._closed or not self._healthy:
            raise errors.NodeUnavailable(f"node {self.node.target} is unhealthy: {self._unhealthy_reason}")
        if self._draining:
            raise errors.NodeUnavailable(f"node {self.node.target} is draining")
        failed = self._failed.get(key)
        if failed is not None:
            until, error = failed
            if time.monotonic() < until:
                raise _copy(error)
            del self._failed[key]

    def _estimate(self, key: Key) -> tuple[int, int]:
        """(bytes the version will take, its size on disk): learned on an earlier load, else 1.2 x disk.

        Only the estimate from disk can refuse a model as larger than the memory cap: a
        learned size carries the noise of RSS sampling, so above the cap it counts as the
        whole cap (the model then loads alone) rather than failing requests.
        """
        disk = self.repository.disk_bytes(*key)
        estimate = int(disk * self.settings.estimate_factor)
        cap = self.settings.memory_bytes
        if cap and estimate > cap:
            raise errors.CapacityExhausted(
                f"model {key[0]} version {key[1]} needs {estimate} bytes "
                f"({self.settings.estimate_factor} x its size on disk), more than "
                f"memory_bytes={cap} of node {self.node.target}")
        size = self._learned.get(key, estimate)
        return (min(size, cap) if cap else size), disk

    # -- shared with cacheloop ---------------------------------------------------------

    def _config(self, *, loading: bool = True) -> pb.ModelServerConfig:
        """The node config: every entry not leaving (nor ``loading`` ones if False), one per name."""
        versions: dict[str, list[int]] = {}
        for (name, version), entry in self._entries.items():
            if entry.state == READY or (loading and entry.state == LOADING):
                versions.setdefault(name, []).append(version)
        config = pb.ModelServerConfig()
        config.model_config_list.SetInParent()
        for name in sorted(versions):
            model = config.model_config_list.config.add(
                name=name, base_path=str(self.repository.base_path(name)), model_platform="tensorflow")
            model.model_version_policy.specific.versions.extend(sorted(versions[name]))
        return config

    def _save(self) -> None:
        """Have the state file written soon (many changes in a row make one write, off the loop)."""
        if self._writer is not None:
            self._writer.schedule(self._state)

    def _state(self) -> CacheState:
        models = [SavedModel(e.key[0], e.key[1], e.bytes, e.measured, e.last_use, e.key in self._pinned)
                  for e in self._entries.values() if e.state == READY]
        learned = {learned_key(*k): v for k, v in self._learned.items()}
        return CacheState(self.node.target, models, learned)

    def _fail_all(self, error: errors.TfscacheError) -> None:
        for pending in self._pending.values():
            _fail(pending.waiters, error)
        self._pending.clear()
        for entry in self._entries.values():
            _fail(entry.waiters, error)
            entry.waiters = []
        for waiters in self._unload_waiters.values():
            _fail(waiters, error)
        self._unload_waiters.clear()
        _fail(self._drained, error)
        self._drained = []
        _fail(self._resync, error)
        self._resync = []

    def _set_health(self, healthy: bool, reason: str = "") -> None:
        self._healthy = healthy
        self._unhealthy_reason = reason
        if healthy:
            self._ready.set()
        else:
            self._ready.clear()


def _version(version: int | None) -> str:
    return "" if version is None else f" version {version}"


def _copy(error: errors.TfscacheError) -> errors.TfscacheError:
    """A fresh instance for each caller, so tracebacks do not pile up on one object."""
    return type(error)(error.message)


def _fail(waiters: list[asyncio.Future], error: errors.TfscacheError) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_exception(_copy(error))


__all__ = ["CacheEvents", "CacheManager", "CacheSettings", "Lease", "QueuedLoad", "ResidentModel"]
