"""The cache manager's state file: what its node's config holds, so a restart can re-adopt it.

JSON (``{"format": 1, "node": ..., "models": [...], "learned": {...}}``), rewritten after
every change to the node's config. ``save_state`` is atomic and durable: it writes a
unique temporary file in the same directory, fsyncs it, renames it over the file and
fsyncs the directory, so a reader, or the next start after a SIGKILL or power loss at any
moment, sees either the old file or the new one, never part of one. (A SIGKILL in the
middle of a write can leave a ``.NAME.*.tmp`` file behind; it is never read.)

``save_state`` blocks for the fsyncs; on the event loop use a ``StateWriter``: ``schedule``
returns at once, and writes are coalesced and done in a worker thread; ``await flush()``
returns once a write that started after everything scheduled so far is on disk. What the
admin API acknowledges (pin, unpin, preload, evict, drain) is flushed before the reply, so
it survives a SIGKILL right after it (docs/state.md); a burst of them shares one write.

A node's cache writes its file through one ``StateFile``: what its ledger holds and the
``LostPins`` (pinned versions the node lost, kept pinned in the file while they are loaded
again). The manager and the reloader both ``save`` through it as they change that state.

A missing or unreadable file reads as empty (logged): the manager then clears the node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tfscache import errors
from tfscache.cache.ledger import READY, Key, Ledger

log = logging.getLogger("tfscache.cache.state")

FORMAT = 1


@dataclass
class SavedVersion:
    """One model version in the node's config when the state was saved."""

    name: str
    version: int
    bytes: int
    measured: bool
    last_use: float  # wall-clock seconds
    pinned: bool = False  # an admin pin: adopted pinned, or loaded and pinned again after a restart


@dataclass
class CacheState:
    node: str = ""
    models: list[SavedVersion] = field(default_factory=list)
    # (name, version) -> bytes measured on an earlier load, kept across evictions.
    learned: dict[str, int] = field(default_factory=dict)


def ledger_state(node: str, ledger: Ledger, lost_pins: dict[Key, SavedVersion]) -> CacheState:
    """What the state file should hold now: the AVAILABLE versions, pins the node lost (still
    pinned while loaded again) and the learned sizes."""
    saved = {e.key: SavedVersion(e.key[0], e.key[1], e.bytes, e.measured, e.last_use,
                                 e.key in ledger.pinned)
             for e in ledger.entries.values() if e.state == READY}
    for key, lost in lost_pins.items():
        saved[key] = replace(saved.get(key, lost), pinned=True)
    learned = {learned_key(*k): v for k, v in ledger.learned.items()}
    return CacheState(node, list(saved.values()), learned)


def learned_key(name: str, version: int) -> str:
    return f"{version}:{name}"


def parse_learned_key(text: str) -> tuple[str, int]:
    """The (name, version) of a ``learned_key``."""
    version, _, name = text.partition(":")
    return name, int(version)


def load_state(path: Path | None) -> CacheState:
    if path is None:
        return CacheState()
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        return CacheState(
            node=str(data.get("node", "")),
            models=[SavedVersion(str(m["name"]), int(m["version"]), int(m["bytes"]),
                               bool(m["measured"]), float(m["last_use"]),
                               bool(m.get("pinned", False)))
                    for m in data["models"]],
            learned={str(k): int(v) for k, v in data.get("learned", {}).items()},
        )
    except FileNotFoundError:
        return CacheState()
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable cache state file %s: %s", path, e)
        return CacheState()


def save_state(path: Path | None, state: CacheState) -> None:
    """Write ``state`` atomically and durably (see the module docstring); errors are logged."""
    try:
        write_state(path, state)
    except OSError as e:
        log.error("cannot write cache state file %s: %s", path, e)


def write_state(path: Path | None, state: CacheState) -> None:
    """``save_state`` that raises ``OSError`` when the file cannot be written."""
    if path is None:
        return
    path = Path(path)
    data = {"format": FORMAT, "node": state.node,
            "models": [asdict(m) for m in state.models], "learned": state.learned}
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_durably(path, json.dumps(data, separators=(",", ":")).encode())


def _replace_durably(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)  # and the rename itself survives a power loss
    finally:
        os.close(directory)


class StateWriter:
    """Writes one state file off the event loop, coalescing: at most one write in flight.

    ``schedule(state_fn)`` returns at once. If no write is in flight one starts; if one is,
    exactly one more follows it, however many schedules came meanwhile. ``state_fn`` is
    called on the event loop when that write starts (so it sees the state of that moment,
    not a stale copy); the write itself runs in a worker thread. ``await flush()`` returns
    once everything scheduled before it was written (fsynced); ``await close()`` flushes,
    after which ``schedule`` raises. A write that fails is logged and counts as done (flush
    does not wait forever on a full disk), but the flushes it was to cover raise
    ``errors.Internal`` naming the file: an acknowledgement waiting on it is not given
    (``close`` only logs). Event-loop thread only.
    """

    def __init__(self, path: Path | None,
                 write: Callable[[Path | None, CacheState], None] = write_state) -> None:
        self.path = path
        self._write = write
        self._state_fn: Callable[[], CacheState] | None = None
        self._scheduled = 0  # schedules so far
        self._written = 0  # the schedules that the last finished write covered
        self._task: asyncio.Task | None = None
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._closed = False
        self.writes = 0  # writes started so far (each one file replaced, fsynced)

    def schedule(self, state_fn: Callable[[], CacheState]) -> None:
        """Ask for a write of ``state_fn()``; the latest ``state_fn`` given wins."""
        if self._closed:
            raise RuntimeError(f"StateWriter for {self.path} is closed")
        if self.path is None:
            return
        self._state_fn = state_fn
        self._scheduled += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"state writer {self.path}")

    @property
    def pending(self) -> bool:
        """True while something scheduled is not written yet."""
        return self._written < self._scheduled

    async def flush(self) -> None:
        """Wait until everything scheduled before this call is written."""
        if not self.pending:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((self._scheduled, future))
        await future

    async def close(self) -> None:
        """Flush, then refuse further schedules (a failed last write is logged, not raised)."""
        self._closed = True
        try:
            await self.flush()
        except errors.Internal:
            pass

    async def _run(self) -> None:
        try:
            while self.pending:
                covers = self._scheduled
                failure = None
                try:
                    state = self._state_fn()
                    self.writes += 1
                    await asyncio.to_thread(self._write, self.path, state)
                except Exception as exc:
                    log.exception("cannot write cache state file %s", self.path)
                    failure = f"the state file {self.path} could not be written: {exc}"
                self._written = covers
                self._wake_flushes(failure)
        finally:
            self._task = None
            for _, future in self._waiters:  # any left: this task was cancelled mid-write
                future.cancel()
            self._waiters = []

    def _wake_flushes(self, failure: str | None) -> None:
        done = [future for upto, future in self._waiters if upto <= self._written]
        self._waiters = [(upto, future) for upto, future in self._waiters if upto > self._written]
        for future in done:
            if future.done():
                continue
            if failure is None:
                future.set_result(None)
            else:
                future.set_exception(errors.Internal(failure))


class LostPins:
    """Pinned versions the node lost, until they are loaded and pinned again.

    A pin survives a lost model (``Ledger.lost``): the version stays in ``Ledger.pinned`` and
    here, so the state file keeps it pinned (a crash meanwhile loses no pin), until it has been
    loaded and pinned again, or its load failed (the pin then goes; the log says so). The
    recovery adds them (tfscache.cache.recovery); the manager loads and pins them again.
    """

    def __init__(self) -> None:
        self._saved: dict[Key, SavedVersion] = {}

    def saved(self) -> dict[Key, SavedVersion]:
        """Key -> what the state file keeps of each (pinned)."""
        return dict(self._saved)

    def add(self, saved: SavedVersion) -> None:
        """``saved`` is to be loaded and pinned again once the node is healthy."""
        self._saved[(saved.name, saved.version)] = replace(saved, pinned=True)

    def unpinned(self, keys) -> None:
        """An admin unpinned ``keys``: not to be pinned again once loaded."""
        for key in keys:
            self._saved.pop(key, None)

    def finish(self, key: Key) -> bool:
        """Loading ``key`` again ended; whether it is still wanted pinned (no unpin came
        meanwhile)."""
        return self._saved.pop(key, None) is not None


class StateFile:
    """The state file of one node's cache: ``save`` has what ``ledger`` and ``lost_pins`` hold
    written soon (``StateWriter``: coalesced, off the loop, the state read as the write starts).
    After ``close``, ``save`` does nothing (nothing is saved after the last write)."""

    def __init__(self, path: Path | None, node: str, ledger: Ledger, lost_pins: LostPins) -> None:
        self.path = path
        self._writer: StateWriter | None = StateWriter(path)
        self._node, self._ledger, self._lost_pins = node, ledger, lost_pins

    def save(self) -> None:
        """Have the state file written soon (many changes in a row make one write)."""
        if self._writer is not None:
            self._writer.schedule(self.state)

    def state(self) -> CacheState:
        """What the file should hold now."""
        return ledger_state(self._node, self._ledger, self._lost_pins.saved())

    async def flush(self) -> None:
        """Wait until the file holds every change saved so far (fsynced); ``errors.Internal`` if
        the write failed."""
        if self._writer is not None:
            await self._writer.flush()

    @property
    def writes(self) -> int:
        """Writes started so far (coalesced writes count once); 0 once closed."""
        return self._writer.writes if self._writer is not None else 0

    async def close(self) -> None:
        """Flush and refuse further writes (a failed last write is logged)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()
