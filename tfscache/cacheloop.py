"""The reloader of one CacheManager: plans each step, unloads victims, loads the batch.

One task per node runs ``run``. It is the only code that sends the node a config, so
the config it sends is always the manager's entries; the node itself serialises
reloads, so a second writer would only queue behind the first.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tfscache import errors, logs
from tfscache.cache import LOADING, READY, UNLOADING, CacheManager, Key, _Entry, _fail, _Pending
from tfscache.cachestate import CacheState
from tfscache.nodeclient import AVAILABLE, END
from tfscache.repository import not_found

log = logging.getLogger("tfscache.cache")

_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.05
_MAX_HOLDERS_NAMED = 20


async def run(cache: CacheManager, state: CacheState) -> None:
    logs.bind(node=cache.node.target)  # this task's log lines name the node
    await _startup(cache, state)
    failures = 0
    while True:
        if not cache._healthy:
            failures = 0 if await _recover(cache, failures) else failures + 1
            continue
        timeout = _next_room_deadline(cache)
        if not cache._wake.is_set():
            try:
                await asyncio.wait_for(cache._wake.wait(), timeout)
            except TimeoutError:
                pass
        cache._wake.clear()
        try:
            await step(cache)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not leave callers hanging
            log.exception("cache step for node %s failed", cache.node.target)
            _mark_unhealthy(cache, f"internal error: {e!r}")


async def step(cache: CacheManager) -> None:
    """Plan once, then unload the victims and load the admitted batch."""
    now = time.monotonic()
    for key, pending in list(cache._pending.items()):
        if not pending.live():
            del cache._pending[key]  # every caller gave up
    if cache._config_stale and not await _send(cache, cache.settings.reload_deadline_s, "re-adopting"):
        return
    cache._config_stale = False
    cache._synced.set()
    if cache._resync and not await _resync(cache):
        return
    leaving = _drop_vanished(cache) + _take_evictions(cache)
    victims, batch = plan(cache, now)
    _expire_room_waits(cache, now)
    leaving += victims
    if leaving and not await _unload(cache, leaving):
        return
    if batch:
        await _load(cache, batch)
    if leaving or batch:
        cache._wake.set()  # progress was made: whatever still waits may fit now
    if cache._draining and not cache._entries and not cache._pending:
        drained, cache._drained = cache._drained, []
        for fut in drained:
            if not fut.done():
                fut.set_result(None)


def _fits(cache: CacheManager, count: int, used: int) -> bool:
    s = cache.settings
    return (not s.max_models or count <= s.max_models) and (not s.memory_bytes or used <= s.memory_bytes)


def plan(cache: CacheManager, now: float) -> tuple[list[Key], list[_Entry]]:
    """Choose victims and admit pending loads, in priority order, within the caps.

    Synchronous: victims turn UNLOADING and admitted models turn LOADING entries
    before anything else can run, so no lease can be taken on a victim.
    """
    entries = cache._entries
    count = len(entries)
    used = sum(e.bytes for e in entries.values())
    idle = [k for k, e in entries.items() if e.state == READY and e.leases == 0 and k not in cache._pinned]
    order = list(cache.policy.victims(idle, now)) if idle else []
    victims: list[Key] = []
    pos = 0
    while not _fits(cache, count, used) and pos < len(order):  # over a cap already
        victims.append(order[pos])
        count, used, pos = count - 1, used - entries[order[pos]].bytes, pos + 1
    cache._over_cap = not _fits(cache, count, used)  # still: the next release wakes the reloader
    queue = sorted((p for p in cache._pending.values() if p.key not in entries),
                   key=lambda p: (-len(p.live()), p.first_seen))
    batch: list[_Entry] = []
    blocked = False
    for pending in queue:
        if not blocked:
            take, c, u, q = [], count, used, pos
            while not _fits(cache, c + 1, u + pending.estimate) and q < len(order):
                take.append(order[q])
                c, u, q = c - 1, u - entries[order[q]].bytes, q + 1
            blocked = not _fits(cache, c + 1, u + pending.estimate)
        if blocked:  # it, and everything behind it, waits for room
            if pending.blocked_since is None:
                pending.blocked_since = now
            continue
        victims += take
        count, used, pos = c + 1, u + pending.estimate, q
        batch.append(_admit(cache, pending))
    for key in victims:
        entries[key].state = UNLOADING
        cache.policy.forget(key)
    for key in victims:
        _evicted(cache, key, "capacity")
    return victims, batch


def _evicted(cache: CacheManager, key: Key, reason: str) -> None:
    """The one log line and event of an eviction (the unload's line follows once the node confirms)."""
    entry = cache._entries[key]
    idle_s = max(0.0, time.time() - entry.last_use)
    log.info("node %s: evicting %s version %s (%s; %d bytes, idle %.1f s)", cache.node.target, key[0], key[1],
             reason, entry.bytes, idle_s, extra={"model": key[0], "version": key[1], "node": cache.node.target,
                                                 "reason": reason, "bytes": entry.bytes, "idle_s": round(idle_s, 3)})
    cache.events.evicted(key, reason, entry.bytes)


def _admit(cache: CacheManager, pending: _Pending) -> _Entry:
    del cache._pending[pending.key]
    if pending.blocked_since is not None:
        cache.events.room_waited(pending.key, time.monotonic() - pending.blocked_since)
    entry = _Entry(pending.key, LOADING, pending.estimate, pending.key in cache._learned, time.time(),
                   disk=pending.disk)
    entry.waiters = pending.live()
    cache._entries[pending.key] = entry
    return entry


def _expire_room_waits(cache: CacheManager, now: float) -> None:
    timeout = cache.settings.room_timeout_s
    for key, pending in list(cache._pending.items()):
        if pending.blocked_since is not None and now - pending.blocked_since >= timeout:
            del cache._pending[key]
            message = room_message(cache, pending)
            log.warning("%s", message)
            cache.events.room_waited(key, now - pending.blocked_since)
            _fail(pending.waiters, errors.CapacityExhausted(message))


def _next_room_deadline(cache: CacheManager) -> float | None:
    blocked = [p.blocked_since for p in cache._pending.values() if p.blocked_since is not None]
    if not blocked:
        return None
    return max(0.0, min(blocked) + cache.settings.room_timeout_s - time.monotonic())


def room_message(cache: CacheManager, pending: _Pending) -> str:
    """RESOURCE_EXHAUSTED text: which cap, and what holds it."""
    s, entries = cache.settings, cache._entries
    used = sum(e.bytes for e in entries.values())
    caps = []
    if s.max_models and len(entries) + 1 > s.max_models:
        caps.append(f"max_models={s.max_models} reached")
    if s.memory_bytes and used + pending.estimate > s.memory_bytes:
        caps.append(f"memory_bytes={s.memory_bytes} reached ({used} bytes in use, "
                    f"{pending.estimate} more needed)")
    holders = [f"{n} version {v} ({_holding(e)})" for (n, v), e in list(entries.items())[:_MAX_HOLDERS_NAMED]]
    if len(entries) > _MAX_HOLDERS_NAMED:
        holders.append(f"and {len(entries) - _MAX_HOLDERS_NAMED} more")
    name, version = pending.key
    return (f"No room on node {cache.node.target} to load model {name} version {version} "
            f"within {s.room_timeout_s} s: {' and '.join(caps) or 'a cap was reached'}; "
            f"held by {', '.join(holders) or 'nothing'}")


def _holding(entry: _Entry) -> str:
    if entry.state == READY:
        return f"{entry.leases} lease{'s' if entry.leases != 1 else ''}, {entry.bytes} bytes"
    return f"{entry.state}, {entry.bytes} bytes"


def _take_evictions(cache: CacheManager) -> list[Key]:
    """Versions ``evict`` marked UNLOADING, and while draining every idle one (pinned or not)."""
    keys, cache._evict_queue = cache._evict_queue, []
    if cache._draining:
        for key, entry in cache._entries.items():
            if entry.state == READY and entry.leases == 0:
                entry.state = UNLOADING
                cache.policy.forget(key)
                keys.append(key)
        if keys:
            log.info("node %s draining: unloading %s", cache.node.target, _names(keys))
    keys = [k for k in keys if k in cache._entries]
    for key in keys:
        _evicted(cache, key, "drain" if cache._draining else "admin")
    return keys


def _drop_vanished(cache: CacheManager) -> list[Key]:
    """Entries whose version directory is gone: sending their base_path could wedge the node."""
    gone = [k for k, e in cache._entries.items()
            if e.state != UNLOADING and cache.repository.version_path(*k) is None]
    for key in gone:
        entry = cache._entries[key]
        log.warning("model %s version %s vanished from the repository; removing it from node %s",
                    key[0], key[1], cache.node.target)
        _evicted(cache, key, "vanished")
        entry.state = UNLOADING
        cache.policy.forget(key)
        _fail(entry.waiters, not_found(*key))
        entry.waiters = []
    return gone


async def _unload(cache: CacheManager, leaving: list[Key]) -> bool:
    """Send the config without ``leaving`` and wait until the node reports END for each."""
    # The batch admitted with them is not sent yet: its loads start once these reached END.
    started, sizes = time.monotonic(), {k: cache._entries[k].bytes for k in leaving}
    if not await _send(cache, cache.settings.rpc_deadline_s, f"unloading {_names(leaving)}", loading=False):
        return False
    deadline = time.monotonic() + cache.settings.reload_deadline_s
    try:
        await asyncio.gather(*(_await_state(cache, k, deadline, want_end=True) for k in leaving))
    except errors.TfscacheError as e:
        _mark_unhealthy(cache, f"unloading {_names(leaving)}: {e.message}")
        return False
    finally:
        for key in leaving:
            cache._entries.pop(key, None)
            cache._pinned.discard(key)
            for fut in cache._unload_waiters.pop(key, []):
                if not fut.done():
                    fut.set_result(None)
        cache._save()
    _unloaded(cache, leaving, time.monotonic() - started, sizes)
    return True


def _unloaded(cache: CacheManager, keys: list[Key], seconds: float, sizes: dict[Key, int]) -> None:
    for key in keys:
        log.info("node %s: unloaded %s version %s in %.3f s (%d bytes)", cache.node.target, key[0], key[1],
                 seconds, sizes[key], extra={"model": key[0], "version": key[1], "node": cache.node.target,
                                             "duration_s": round(seconds, 6), "bytes": sizes[key]})
        cache.events.unloaded(key, seconds, sizes[key])


async def _load(cache: CacheManager, batch: list[_Entry]) -> None:
    for entry in list(batch):  # its directory may have gone since it was requested
        if cache.repository.version_path(*entry.key) is None:
            batch.remove(entry)
            del cache._entries[entry.key]
            _fail(entry.waiters, not_found(*entry.key))
    if not batch:
        return
    names = _names([e.key for e in batch])
    rss_before = cache._memory.rss()
    started = time.monotonic()
    s = cache.settings
    try:
        await cache.node.reload(cache._config(), deadline_s=s.reload_deadline_s)
    except (errors.DeadlineExceeded, errors.Unavailable) as e:
        _mark_unhealthy(cache, f"reload loading {names}: {e.message}")
        return
    except errors.TfscacheError as e:
        # Trust GetModelStatus, not this (a re-added model can fail the wait and load anyway).
        log.info("node %s: reload loading %s returned %s: %s; checking status",
                 cache.node.target, names, e.grpc_code.name, e.message)
    deadline = started + s.reload_deadline_s
    results = await asyncio.gather(*(_await_state(cache, e.key, deadline, want_end=False) for e in batch),
                                   return_exceptions=True)
    load_s = time.monotonic() - started
    loaded = [e for e, r in zip(batch, results) if r is None]
    _measure(cache, loaded, rss_before, cache._memory.rss())
    now = time.monotonic()
    for entry in loaded:
        entry.state = READY
        cache.policy.record_load(entry.key, entry.bytes, load_s, now)
        log.info("node %s: loaded %s version %s in %.3f s (%d bytes%s)", cache.node.target,
                 entry.key[0], entry.key[1], load_s, entry.bytes, "" if entry.measured else ", estimated",
                 extra={"model": entry.key[0], "version": entry.key[1], "node": cache.node.target,
                        "duration_s": round(load_s, 6), "bytes": entry.bytes, "measured": entry.measured})
        cache.events.loaded(entry.key, load_s, entry.bytes, entry.measured)
        waiters, entry.waiters = entry.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(cache._lease(entry))
    failed = [(e, r) for e, r in zip(batch, results) if r is not None]
    for entry, error in failed:
        if not isinstance(error, errors.TfscacheError):
            error = errors.Internal(f"checking load of {entry.key[0]}: {error!r}")
        log.warning("node %s: loading %s version %s failed after %.3f s: %s: %s", cache.node.target,
                    entry.key[0], entry.key[1], load_s, error.grpc_code.name, error.message,
                    extra={"model": entry.key[0], "version": entry.key[1], "node": cache.node.target,
                           "duration_s": round(load_s, 6), "bytes": entry.bytes})
        cache.events.load_failed(entry.key, load_s, error)
        del cache._entries[entry.key]
        cache._failed[entry.key] = (now + s.failure_backoff_s, error)
        _fail(entry.waiters, error)
        entry.waiters = []
    if any(isinstance(r, errors.Unavailable) for _, r in failed):
        _mark_unhealthy(cache, f"checking status of {names}: node unavailable")
    elif failed:  # a failed version stays aspired and sticky on the node unless removed
        await _send(cache, s.rpc_deadline_s, f"removing failed {_names([e.key for e, _ in failed])}")
    cache._save()


async def _await_state(cache: CacheManager, key: Key, deadline: float, *, want_end: bool) -> None:
    """Poll GetModelStatus until ``key`` is END (``want_end``) or AVAILABLE.

    Only a fallback: a load's reload returns once the model settled, so the first
    answer nearly always decides. A version that ends in error raises that error.
    """
    name, version = key
    delay = _FIRST_POLL_S
    while True:
        statuses = await cache.node.status(name, version, deadline_s=cache.settings.rpc_deadline_s)
        status = next((st for st in statuses if st.version == version), None)
        if want_end:
            if status is None or status.state == END:
                return
        elif status is not None:
            if status.state == AVAILABLE:
                return None
            if status.state == END and status.status.error_code:
                raise errors.error_for_code(status.status.error_code, status.status.error_message)
        if time.monotonic() + delay > deadline:
            state = "END" if want_end else "AVAILABLE"
            raise errors.DeadlineExceeded(
                f"model {name} version {version} did not reach {state} on node {cache.node.target} "
                f"within {cache.settings.reload_deadline_s} s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, _MAX_POLL_S)


def _measure(cache: CacheManager, loaded: list[_Entry], before: int | None, after: int | None) -> None:
    """Share the node's RSS growth across the batch by estimate, never below the size on disk.

    RSS can grow by less than a model takes when the allocator reuses memory an
    eviction freed; the size on disk is a floor no SavedModel's variables go under.
    """
    if before is None or after is None or not loaded:
        return
    growth = after - before
    total = sum(e.bytes for e in loaded) or 1
    cap = cache.settings.memory_bytes
    for entry in loaded:
        entry.bytes = max(int(growth * entry.bytes / total), entry.disk, 1)
        if cap:
            entry.bytes = min(entry.bytes, cap)  # see CacheManager._estimate
        entry.measured = True
        cache._learned[entry.key] = entry.bytes


async def _send(cache: CacheManager, deadline_s: float, why: str, *, loading: bool = True) -> bool:
    """Send the current config; False (and the node unhealthy) if that fails."""
    try:
        await cache.node.reload(cache._config(loading=loading), deadline_s=deadline_s)
        return True
    except errors.TfscacheError as e:
        _mark_unhealthy(cache, f"reload {why}: {e.grpc_code.name}: {e.message}")
        return False


def _mark_unhealthy(cache: CacheManager, reason: str) -> None:
    log.error("node %s is unhealthy: %s", cache.node.target, reason)
    cache._set_health(False, reason)
    cache._fail_all(errors.NodeUnavailable(f"node {cache.node.target} is unhealthy: {reason}"))


async def _resync(cache: CacheManager) -> bool:
    """Answer ``recheck``: if the node lost resident models (it restarted), send the config again.

    One status call per resident model decides; the reload happens only when one was
    lost, so callers that arrive after the restore cost no second reload. False (and the
    node unhealthy) when the node cannot be reached.
    """
    waiters, cache._resync = cache._resync, []
    s = cache.settings
    try:
        lost = [key for key, entry in list(cache._entries.items()) if entry.state == READY
                and not await _available(cache, key)]
        if lost:
            log.warning("node %s lost %s (it restarted?); sending its config again", cache.node.target,
                        _names(lost))
            await cache.node.reload(cache._config(), deadline_s=s.reload_deadline_s)
            deadline = time.monotonic() + s.reload_deadline_s
            results = await asyncio.gather(*(_await_state(cache, k, deadline, want_end=False) for k in lost),
                                           return_exceptions=True)
            for key, result in zip(lost, results):
                if result is not None and key in cache._entries:
                    _evicted(cache, key, "node_lost")
                    del cache._entries[key]
                    cache.policy.forget(key)
            cache._save()
    except errors.TfscacheError as e:
        _mark_unhealthy(cache, f"restoring its config: {e.grpc_code.name}: {e.message}")
        _fail(waiters, errors.NodeUnavailable(f"node {cache.node.target} is unhealthy: {e.message}"))
        return False
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    return True


async def _available(cache: CacheManager, key: Key) -> bool:
    statuses = await cache.node.status(*key, deadline_s=cache.settings.rpc_deadline_s)
    return any(st.version == key[1] and st.state == AVAILABLE for st in statuses)


async def _startup(cache: CacheManager, state: CacheState) -> None:
    """Wait for the node to answer, then re-adopt the saved models it still serves; healthy then."""
    failures = 0
    while True:
        try:
            lost_pins = await adopt(cache, state)
            break
        except errors.TfscacheError as e:
            if failures == 0 or failures % 10 == 0:
                log.warning("node %s not answering yet (%s: %s); waiting for it", cache.node.target,
                            e.grpc_code.name, e.message)
            failures += 1
            if await cache.node.wait_ready(cache.settings.health_retry_s):
                await asyncio.sleep(min(cache.settings.health_retry_s, 0.05 * 2**failures))  # answers, but fails
    cache._starting = False
    cache._set_health(True)
    cache._repins = {asyncio.create_task(repin(cache, key)) for key in lost_pins}  # the node lost them


async def _recover(cache: CacheManager, failures: int) -> bool:
    """Retry the node; keep what it still serves, drop what it does not. Whether it is healthy again."""
    s = cache.settings
    if failures:  # it answered but failed: back off, up to health_retry_s
        await asyncio.sleep(min(s.health_retry_s, 0.05 * 2**failures))
    if not await cache.node.wait_ready(s.health_retry_s):
        return False
    for key, entry in list(cache._entries.items()):
        if entry.state == LOADING:  # its outcome is unknown: leave it out of the config
            del cache._entries[key]
            cache.policy.forget(key)
    try:
        await cache.node.reload(cache._config(), deadline_s=s.rpc_deadline_s)
        for key, entry in list(cache._entries.items()):
            statuses = await cache.node.status(*key, deadline_s=s.rpc_deadline_s)
            state = next((st.state for st in statuses if st.version == key[1]), None)
            if entry.state == UNLOADING and state not in (None, END):
                continue
            if entry.state == UNLOADING or state != AVAILABLE:
                if entry.state != UNLOADING:
                    _evicted(cache, key, "node_lost")
                del cache._entries[key]
                cache.policy.forget(key)
    except errors.TfscacheError as e:
        log.warning("node %s still unhealthy: %s: %s", cache.node.target, e.grpc_code.name, e.message)
        return False
    log.info("node %s is healthy again; %d models resident", cache.node.target, len(cache._entries))
    cache._config_stale = False
    cache._synced.set()
    cache._set_health(True)
    cache._save()
    cache._wake.set()
    return True


async def adopt(cache: CacheManager, state: CacheState) -> list[Key]:
    """At start: keep the saved models the node still serves; the first step's config clears the rest.

    Returns the pinned versions the node no longer serves (still on disk), to load and pin again.
    The node's config is sent by the reloader's first step, not here: a node busy with a long
    load (this process restarted under it) answers status calls but queues the reload.
    """
    s = cache.settings
    for text, size in state.learned.items():
        version, _, name = text.partition(":")
        cache._learned[(name, int(version))] = size
    now = time.monotonic()
    lost_pins = []
    cache._entries.clear()  # a retry after the node stopped answering midway starts over
    cache._pinned.clear()
    for saved in sorted(state.models, key=lambda m: m.last_use):
        key = (saved.name, saved.version)
        try:
            if cache.repository.version_path(*key) is None:
                continue
        except errors.TfscacheError:  # an unsafe name in a hand-edited file
            continue
        statuses = await cache.node.status(*key, deadline_s=s.rpc_deadline_s)
        if any(st.version == saved.version and st.state == AVAILABLE for st in statuses):
            cache._entries[key] = _Entry(key, READY, saved.bytes, saved.measured, saved.last_use)
            cache.policy.record_load(key, saved.bytes, 0.0, now)
            if saved.pinned:
                cache._pinned.add(key)
        elif saved.pinned:
            lost_pins.append(key)
    log.info("node %s: adopted %d models (%d pinned) from %s", cache.node.target, len(cache._entries),
             len(cache._pinned), cache.state_file)
    cache._config_stale = True
    cache._wake.set()  # the first step sends the config (and evicts down to the caps, if they shrank)
    cache._save()
    return lost_pins


async def repin(cache: CacheManager, key: Key) -> None:
    """Load and pin again a version that was pinned when the state was saved but the node lost."""
    try:
        await cache.pin(*key)
    except errors.TfscacheError as e:
        log.warning("node %s: model %s version %s was pinned but the node lost it; loading it again failed "
                    "(%s: %s): pin it again", cache.node.target, key[0], key[1], e.grpc_code.name, e.message)
    else:
        log.info("node %s: model %s version %s loaded and pinned again (the node had lost it)",
                 cache.node.target, key[0], key[1])


def _names(keys: list[Key]) -> str:
    return ", ".join(f"{n}:{v}" for n, v in keys)
