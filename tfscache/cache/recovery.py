"""Start-up and recovery of one node's cache: re-adopt what the node serves, and bring it back.

``startup`` waits for the node to answer and keeps the saved models (state file) the node
still serves; the reloader's first step then sends the wanted set, which clears the rest
(a node busy with a long load answers status calls but queues that reload, so nothing
else waits for it). ``recover`` brings an unhealthy node back: it waits for the channel to
connect, sends the wanted set again and drops what the node no longer serves. Both take
the node's ``Reloader`` (``tfscache.cache.reloader``) and act through it.

A model the node lost goes one way whichever path finds it (``recover`` here, or the
reloader's ``resync`` after a ``recheck``): ``Reloader.lost``, which calls ``Ledger.lost``.
Its pin survives: ``LostPins`` loads and pins it again, and the state file keeps it pinned
meanwhile (docs/state.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from tfscache import errors
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Key
from tfscache.cache.signals import done, fail
from tfscache.cache.state import CacheState, SavedVersion, parse_learned_key

log = logging.getLogger("tfscache.cache")


class LostPins:
    """Pinned versions the node lost, being loaded and pinned again.

    A pin survives a lost model (``Ledger.lost``): the version stays in ``Ledger.pinned`` and
    here, so the state file keeps it pinned (a crash meanwhile loses no pin), until ``repin``
    has loaded and pinned it again, or its load failed (the pin then goes; the log says so).
    """

    def __init__(self) -> None:
        self._saved: dict[Key, SavedVersion] = {}
        self._tasks: dict[Key, asyncio.Task] = {}

    def saved(self) -> dict[Key, SavedVersion]:
        """Key -> what the state file keeps of each (pinned)."""
        return dict(self._saved)

    def add(self, saved: SavedVersion) -> None:
        """Load and pin ``saved`` again once the node is healthy (``start``)."""
        self._saved[(saved.name, saved.version)] = replace(saved, pinned=True)

    def start(self, reloader) -> None:
        """Start loading and pinning again every added version not already being loaded."""
        for key, saved in self._saved.items():
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(repin(reloader, saved), name=f"repin {key[0]}:{key[1]}")

    def unpinned(self, keys) -> None:
        """An admin unpinned ``keys``: not to be pinned again once loaded."""
        for key in keys:
            self._saved.pop(key, None)

    def finish(self, key: Key) -> bool:
        """``key``'s repin ended; whether it is still wanted pinned (no unpin came meanwhile)."""
        self._tasks.pop(key, None)
        return self._saved.pop(key, None) is not None

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()


async def startup(reloader, state: CacheState) -> None:
    """Wait for the node to answer, then re-adopt the saved models it still serves; healthy then."""
    failures = 0
    retry_s = reloader.settings.health_retry_s
    while True:
        try:
            if not await reloader.adapter.wait_ready(retry_s):  # not listening yet (a pod starting)
                raise errors.NodeUnavailable(f"node {reloader.node} is not accepting connections")
            lost_pins = await adopt(reloader, state)
            break
        except errors.TfscacheError as e:
            if failures % 10 == 0:
                log.warning("node %s not answering yet (%s: %s); waiting for it", reloader.node,
                            e.grpc_code.name, e.message)
            failures += 1
            if await reloader.adapter.wait_ready(retry_s):
                await asyncio.sleep(min(retry_s, 0.05 * 2**failures))  # it answers, but fails: back off
    reloader.signals.started()
    for saved in lost_pins:  # kept in the state file until pinned again
        reloader.lost_pins.add(saved)
    reloader.lost_pins.start(reloader)


async def adopt(reloader, state: CacheState) -> list[SavedVersion]:
    """Keep the saved models the node still serves; the pinned ones it lost, to load and pin again
    (their pins survive: ``Ledger.lost``)."""
    ledger, s = reloader.ledger, reloader.settings
    for text, size in state.learned.items():
        ledger.learn(parse_learned_key(text), size)
    now = time.monotonic()
    lost_pins = []
    ledger.reset()  # a retry after the node stopped answering midway starts over
    for saved in sorted(state.models, key=lambda m: m.last_use):
        key = (saved.name, saved.version)
        try:
            on_disk = await asyncio.to_thread(reloader.repository.version_path, *key)
        except errors.TfscacheError:  # an unsafe name in a hand-edited file
            continue
        if on_disk is None:
            continue
        if await reloader.adapter.available(key, s.rpc_deadline_s):
            ledger.adopted(key, saved.bytes, saved.measured, saved.last_use, now, saved.pinned)
        elif saved.pinned:
            ledger.pin(key)
            lost_pins.append(saved)
    log.info("node %s: adopted %d models (%d pinned)", reloader.node, len(ledger.entries),
             sum(key in ledger.pinned for key in ledger.entries))
    reloader.signals.mark_config_stale()
    reloader.signals.wake()  # the first step sends the wanted set (and evicts down to shrunk caps)
    reloader.signals.services.save()
    return lost_pins


async def repin(reloader, saved: SavedVersion) -> None:
    """Load and pin again a version that was pinned but the node lost (at start-up: since the state
    was saved; later: ``recover`` or ``resync`` found it gone).

    Until it is pinned again it stays in the state file as pinned, so a crash meanwhile loses
    no pin; a load that fails drops the pin (the log says so).
    """
    key = (saved.name, saved.version)
    services = reloader.signals.services
    try:
        await services.pin(*key)
    except errors.TfscacheError as e:
        reloader.lost_pins.finish(key)
        reloader.ledger.unpin([key])
        services.save()
        log.warning("node %s: model %s version %s was pinned but the node lost it; loading it again failed "
                    "(%s: %s): pin it again", reloader.node, key[0], key[1], e.grpc_code.name, e.message)
    else:
        if not reloader.lost_pins.finish(key):  # unpinned while it was being loaded again
            reloader.ledger.unpin([key])
        services.save()
        log.info("node %s: model %s version %s loaded and pinned again (the node had lost it)",
                 reloader.node, key[0], key[1])


async def recover(reloader, failures: int) -> bool:
    """Retry the node; keep what it still serves; what it lost goes (``Reloader.lost``: pins
    survive and are loaded again). Whether it is healthy again."""
    s, ledger, sig = reloader.settings, reloader.ledger, reloader.signals
    if failures:  # it answered but failed: back off, up to health_retry_s
        await asyncio.sleep(min(s.health_retry_s, 0.05 * 2**failures))
    if not await reloader.adapter.wait_ready(s.health_retry_s):
        return False
    for key, entry in list(ledger.entries.items()):
        if entry.state == LOADING:  # its outcome is unknown: leave it out
            ledger.lost(key)
    try:
        await reloader.adapter.sync(reloader.wanted(), s.rpc_deadline_s)
        sig.config_sent()  # (``Reloader.lost`` marks it stale again: the lost ones are to go)
        for key, entry in list(ledger.entries.items()):
            if entry.state == UNLOADING:
                if await reloader.adapter.available(key, s.rpc_deadline_s):
                    continue
                ledger.unloaded(key)
            elif not await reloader.adapter.available(key, s.rpc_deadline_s):
                reloader.lost(key)
    except errors.TfscacheError as e:
        log.warning("node %s still unhealthy: %s: %s", reloader.node, e.grpc_code.name, e.message)
        return False
    log.info("node %s is healthy again; %d models resident", reloader.node, len(ledger.entries))
    sig.set_health(True)
    sig.services.save()
    sig.wake()
    sig.rechecked()  # the node has its wanted set again
    reloader.lost_pins.start(reloader)
    return True


async def resync(reloader) -> bool:
    """Answer ``recheck``: if the node lost resident models (it restarted), send them again.

    One status call per resident model decides; the reload happens only when one was
    lost, so callers that arrive after the restore cost no second reload. False (and the
    node unhealthy) when the node cannot be reached.
    """
    sig = reloader.signals
    waiters = sig.take_rechecks()
    s = reloader.settings
    try:
        lost = [key for key, entry in list(reloader.ledger.entries.items()) if entry.state == READY
                and not await reloader.adapter.available(key, s.rpc_deadline_s)]
        if lost:
            log.warning("node %s lost %s (it restarted?); sending its config again", reloader.node, names(lost))
            results = await reloader.adapter.load(lost, reloader.wanted(), s.reload_deadline_s)
            for key, result in results.items():
                if result is not None and key in reloader.ledger.entries:
                    reloader.lost(key)
            sig.services.save()
    except errors.TfscacheError as e:
        reloader.mark_unhealthy(f"restoring its config: {e.grpc_code.name}: {e.message}")
        fail(waiters, errors.NodeUnavailable(f"node {reloader.node} is unhealthy: {e.message}"))
        return False
    done(waiters)
    reloader.lost_pins.start(reloader)
    return True


def names(keys: list[Key]) -> str:
    return ", ".join(f"{n}:{v}" for n, v in keys)
