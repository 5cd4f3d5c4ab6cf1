"""Start-up and recovery of one node's cache: re-adopt what the node serves, and bring it back.

One ``Recovery`` per node, owned by its reloader (``tfscache.cache.reloader``) and given what it
works on: the node's adapter, the ledger, the signals, the lost pins, the state file, the
repository and the cache's settings. ``startup`` waits for the node to answer and keeps the
saved models (state file) the node still serves; the reloader's first step then sends the
wanted set, which clears the rest (a node busy with a long load answers status calls but
queues that reload, so nothing else waits for it). ``mark_unhealthy`` is how any failure to
reach the node ends (every waiter gets UNAVAILABLE); ``recover`` brings an unhealthy node
back: it waits for the channel to connect, sends the wanted set again and drops what the node
no longer serves. ``resync`` answers a ``recheck`` (or a replaced node process): the models a
restarted node lost are sent again.

A model the node lost goes one way whichever path finds it (``recover`` or ``resync``):
``Recovery.lost``, which calls ``Ledger.lost``. Its pin survives: the version is kept in
``LostPins`` (so the state file keeps it pinned meanwhile, docs/state.md), and each time the
node is found healthy with its wanted set again (after ``startup``, a ``recover``, a
``resync``) ``pins_to_restore`` hands the lost pins to the reloader's owner, the cache manager,
which loads and pins them again. Recovery never calls back into the manager.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tfscache import errors
from tfscache.cache.adapter import NodeAdapter
from tfscache.cache.events import Evictions
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Key, Ledger
from tfscache.cache.signals import Signals, done, fail
from tfscache.cache.state import CacheState, LostPins, SavedVersion, StateFile, parse_learned_key
from tfscache.repository.local import ModelRepository

log = logging.getLogger("tfscache.cache")


class Recovery:
    """The health of one node's cache: start-up re-adoption, turning unhealthy, recovering, and
    resyncing a node that lost models."""

    def __init__(self, adapter: NodeAdapter, ledger: Ledger, signals: Signals, lost_pins: LostPins,
                 state_file: StateFile, repository: ModelRepository, settings,
                 evictions: Evictions) -> None:
        """``settings``: the cache section (``health_retry_s``, ``rpc_deadline_s``,
        ``reload_deadline_s``); ``evictions``: where a lost model's ``node_lost`` eviction is
        reported."""
        self._adapter, self._node, self._repository = adapter, adapter.target, repository
        self._ledger, self._signals, self._settings = ledger, signals, settings
        self._lost_pins, self._state_file, self._evictions = lost_pins, state_file, evictions
        self._failures = 0  # failed recoveries in a row: each backs off longer
        self._restore = False  # the node has its wanted set again: the lost pins can be restored

    def pins_to_restore(self) -> list[SavedVersion]:
        """The lost pins to load and pin again now: every one, once after each time the node was
        found healthy with its wanted set again (``startup``, ``recover``, ``resync``), else
        none."""
        if not self._restore:
            return []
        self._restore = False
        return list(self._lost_pins.saved().values())

    async def startup(self, state: CacheState) -> None:
        """Wait for the node to answer, then re-adopt the saved models it still serves; healthy
        then."""
        failures = 0
        retry_s = self._settings.health_retry_s
        while True:
            try:
                if not await self._adapter.wait_ready(retry_s):  # not listening yet (starting)
                    raise errors.NodeUnavailable(f"node {self._node} is not accepting connections")
                lost_pins = await self.adopt(state)
                break
            except errors.TfscacheError as e:
                if failures % 10 == 0:
                    log.warning("node %s not answering yet (%s: %s); waiting for it", self._node,
                                e.grpc_code.name, e.message)
                failures += 1
                if await self._adapter.wait_ready(retry_s):  # it answers, but fails: back off
                    await asyncio.sleep(min(retry_s, 0.05 * 2**failures))
        self._signals.started()
        for saved in lost_pins:  # kept in the state file until pinned again
            self._lost_pins.add(saved)
        self._restore = True

    async def adopt(self, state: CacheState) -> list[SavedVersion]:
        """Keep the saved models the node still serves; the pinned ones it lost, to load and pin
        again (their pins survive: ``Ledger.lost``)."""
        ledger, s = self._ledger, self._settings
        for text, size in state.learned.items():
            ledger.learn(parse_learned_key(text), size)
        now = time.monotonic()
        lost_pins = []
        ledger.reset()  # a retry after the node stopped answering midway starts over
        for saved in sorted(state.models, key=lambda m: m.last_use):
            key = (saved.name, saved.version)
            try:
                on_disk = await asyncio.to_thread(self._repository.version_path, *key)
            except errors.TfscacheError:  # an unsafe name in a hand-edited file
                continue
            if on_disk is None:
                continue
            if await self._adapter.available(key, s.rpc_deadline_s):
                ledger.adopted(key, saved.bytes, saved.measured, saved.last_use, now, saved.pinned)
            elif saved.pinned:
                ledger.pin(key)
                lost_pins.append(saved)
        log.info("node %s: adopted %d models (%d pinned)", self._node, len(ledger.entries),
                 sum(key in ledger.pinned for key in ledger.entries))
        self._signals.mark_config_stale()
        self._signals.wake()  # the first step sends the wanted set (and evicts down to shrunk caps)
        self._state_file.save()
        return lost_pins

    def mark_unhealthy(self, reason: str) -> None:
        """The node failed (unreachable, a deadline passed, an internal error): every waiter gets
        UNAVAILABLE, and the reloader recovers it next."""
        log.error("node %s is unhealthy: %s", self._node, reason)
        self._signals.set_health(False, reason)
        self._signals.fail_all(self._ledger,
                              errors.NodeUnavailable(f"node {self._node} is unhealthy: {reason}"))

    async def recover(self) -> bool:
        """Retry the node; keep what it still serves; what it lost goes (``lost``: pins survive and
        are loaded again). Whether it is healthy again."""
        healthy = await self._recover(self._failures)
        self._failures = 0 if healthy else self._failures + 1
        return healthy

    async def _recover(self, failures: int) -> bool:
        s, ledger, sig = self._settings, self._ledger, self._signals
        if failures:  # it answered but failed: back off, up to health_retry_s
            await asyncio.sleep(min(s.health_retry_s, 0.05 * 2**failures))
        if not await self._adapter.wait_ready(s.health_retry_s):
            return False
        for key, entry in list(ledger.entries.items()):
            if entry.state == LOADING:  # its outcome is unknown: leave it out
                ledger.lost(key)
        try:
            await self._adapter.sync(ledger.wanted(), s.rpc_deadline_s)
            sig.config_sent()  # (``lost`` marks it stale again: the lost ones are to go)
            for key, entry in list(ledger.entries.items()):
                if entry.state == UNLOADING:
                    if await self._adapter.available(key, s.rpc_deadline_s):
                        continue
                    ledger.unloaded(key)
                elif not await self._adapter.available(key, s.rpc_deadline_s):
                    self.lost(key)
        except errors.TfscacheError as e:
            log.warning("node %s still unhealthy: %s: %s", self._node, e.grpc_code.name, e.message)
            return False
        log.info("node %s is healthy again; %d models resident", self._node, len(ledger.entries))
        sig.set_health(True)
        self._state_file.save()
        sig.wake()
        sig.rechecked()  # the node has its wanted set again
        self._restore = True
        return True

    async def resync(self) -> bool:
        """Answer ``recheck``: if the node lost resident models (it restarted), send them again.

        One status call per resident model decides; the reload happens only when one was
        lost, so callers that arrive after the restore cost no second reload. False (and the
        node unhealthy) when the node cannot be reached.
        """
        sig, s, ledger = self._signals, self._settings, self._ledger
        waiters = sig.take_rechecks()
        try:
            lost = [key for key, entry in list(ledger.entries.items()) if entry.state == READY
                    and not await self._adapter.available(key, s.rpc_deadline_s)]
            if lost:
                log.warning("node %s lost %s (it restarted?); sending its config again", self._node,
                            names(lost))
                results = await self._adapter.load(lost, ledger.wanted(), s.reload_deadline_s)
                for key, result in results.items():
                    if result is not None and key in ledger.entries:
                        self.lost(key)
                self._state_file.save()
        except errors.TfscacheError as e:
            self.mark_unhealthy(f"restoring its config: {e.grpc_code.name}: {e.message}")
            fail(waiters, errors.NodeUnavailable(f"node {self._node} is unhealthy: {e.message}"))
            return False
        done(waiters)
        self._restore = True
        return True

    def lost(self, key: Key) -> None:
        """The node lost ``key`` (it restarted): the one path for it, whether ``recover`` or
        ``resync`` found it. The entry leaves (``Ledger.lost``); a pinned one keeps its pin and is
        loaded and pinned again once the node is healthy (``LostPins``). The node may still hold
        the version in some state (TF Serving keeps a failed one sticky), so the next step sends
        it the wanted set without it first, and a load of it starts afresh."""
        self._evictions.evicted(key, "node_lost")
        self._signals.mark_config_stale()
        entry = self._ledger.lost(key)
        if key in self._ledger.pinned and entry is not None:
            self._lost_pins.add(SavedVersion(key[0], key[1], entry.bytes, entry.measured,
                                            entry.last_use, True))


def names(keys: list[Key]) -> str:
    return ", ".join(f"{n}:{v}" for n, v in keys)
