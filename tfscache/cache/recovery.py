"""Start-up and recovery of one node's cache: re-adopt what the node serves, and bring it back.

``startup`` waits for the node to answer and keeps the saved models (state file) the node
still serves; the reloader's first step then sends the wanted set, which clears the rest
(a node busy with a long load answers status calls but queues that reload, so nothing
else waits for it). ``recover`` brings an unhealthy node back: it waits for the channel to
connect, sends the wanted set again and drops what the node no longer serves. Both take
the node's ``Reloader`` (``tfscache.cache.reloader``) and act through it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tfscache import errors
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Entry
from tfscache.cache.state import CacheState, SavedVersion, parse_learned_key

log = logging.getLogger("tfscache.cache")


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
    sig = reloader.signals
    sig.starting = False
    sig.set_health(True)
    sig.lost_pins = {(p.name, p.version): p for p in lost_pins}  # kept in the state file until pinned again
    sig.repins = {asyncio.create_task(repin(reloader, saved)) for saved in lost_pins}


async def adopt(reloader, state: CacheState) -> list[SavedVersion]:
    """Keep the saved models the node still serves; the pinned ones it lost, to load and pin again."""
    ledger, s = reloader.ledger, reloader.settings
    for text, size in state.learned.items():
        ledger.learned[parse_learned_key(text)] = size
    now = time.monotonic()
    lost_pins = []
    ledger.entries.clear()  # a retry after the node stopped answering midway starts over
    ledger.pinned.clear()
    for saved in sorted(state.models, key=lambda m: m.last_use):
        key = (saved.name, saved.version)
        try:
            on_disk = await asyncio.to_thread(reloader.repository.version_path, *key)
        except errors.TfscacheError:  # an unsafe name in a hand-edited file
            continue
        if on_disk is None:
            continue
        if await reloader.adapter.available(key, s.rpc_deadline_s):
            ledger.entries[key] = Entry(key, READY, saved.bytes, saved.measured, saved.last_use)
            reloader.policy.record_load(key, saved.bytes, 0.0, now)
            if saved.pinned:
                ledger.pinned.add(key)
        elif saved.pinned:
            lost_pins.append(saved)
    log.info("node %s: adopted %d models (%d pinned)", reloader.node, len(ledger.entries), len(ledger.pinned))
    reloader.signals.config_stale = True
    reloader.signals.wake.set()  # the first step sends the wanted set (and evicts down to shrunk caps)
    reloader.signals.save()
    return lost_pins


async def repin(reloader, saved: SavedVersion) -> None:
    """Load and pin again a version that was pinned when the state was saved but the node lost.

    Until it is pinned again it stays in the state file as pinned, so a crash meanwhile loses
    no pin; a load that fails drops it (the log says so).
    """
    key = (saved.name, saved.version)
    try:
        await reloader.signals.pin(*key)
    except errors.TfscacheError as e:
        reloader.signals.lost_pins.pop(key, None)
        log.warning("node %s: model %s version %s was pinned but the node lost it; loading it again failed "
                    "(%s: %s): pin it again", reloader.node, key[0], key[1], e.grpc_code.name, e.message)
    else:
        reloader.signals.lost_pins.pop(key, None)
        log.info("node %s: model %s version %s loaded and pinned again (the node had lost it)",
                 reloader.node, key[0], key[1])


async def recover(reloader, failures: int) -> bool:
    """Retry the node; keep what it still serves, drop what it does not. Whether it is healthy again."""
    s, ledger, sig = reloader.settings, reloader.ledger, reloader.signals
    if failures:  # it answered but failed: back off, up to health_retry_s
        await asyncio.sleep(min(s.health_retry_s, 0.05 * 2**failures))
    if not await reloader.adapter.wait_ready(s.health_retry_s):
        return False
    for key, entry in list(ledger.entries.items()):
        if entry.state == LOADING:  # its outcome is unknown: leave it out
            del ledger.entries[key]
            reloader.policy.forget(key)
    try:
        await reloader.adapter.sync(reloader.wanted(), s.rpc_deadline_s)
        for key, entry in list(ledger.entries.items()):
            if entry.state == UNLOADING:
                if await reloader.adapter.available(key, s.rpc_deadline_s):
                    continue
                del ledger.entries[key]
            elif not await reloader.adapter.available(key, s.rpc_deadline_s):
                reloader.evicted(key, "node_lost")
                del ledger.entries[key]
                reloader.policy.forget(key)
    except errors.TfscacheError as e:
        log.warning("node %s still unhealthy: %s: %s", reloader.node, e.grpc_code.name, e.message)
        return False
    log.info("node %s is healthy again; %d models resident", reloader.node, len(ledger.entries))
    sig.config_stale = False
    sig.synced.set()
    sig.set_health(True)
    sig.save()
    sig.wake.set()
    for fut in sig.resync:  # the node has its wanted set again
        if not fut.done():
            fut.set_result(None)
    sig.resync = []
    return True
