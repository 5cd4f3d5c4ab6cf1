"""``tfscache serve --request-log FILE``: the request log that ``tfscache simulate`` replays.

One row per request that took a lease on one of this process's nodes (a request sent on
to a peer sidecar is logged by that peer, so a log merged from every sidecar has each
request once; ``tfscache simulate`` sorts by time). Columns, the simulator's first
(tfscache/sim/trace.py; it ignores the others)::

    time          wall-clock seconds when the request arrived
    model         the model name
    version       the version served
    load_seconds  how long the model's last load on that node took (0: not loaded by this
                  process, e.g. adopted at a restart)
    bytes         the model's bytes after that load (measured, else estimated; 0 as above)
    node          the node that served it
    cold          1 if this request waited for a load, else 0
    code          how it ended (gRPC code name, or HTTP status)
    prefetched    1 if a prefetch loaded the model and this is its first request since, else 0
                  (docs/prefetch.md); a CSV log begun before this column keeps its columns

CSV with a header row, unless FILE ends in ``.jsonl`` or ``.ndjson`` (JSON Lines, the same
keys). An existing file is appended to (a CSV one must have the same header). Rows are
queued on the event loop and written by one thread: the event loop never waits for the disk.

Many processes write the one file (``tfscache serve --workers N``: each worker logs the
requests it received). The file is opened O_APPEND and every write() holds whole rows (a
batch of them, at most 64 KiB, never part of a row), so rows from different processes never
interleave: on a local file system the kernel appends each write() whole, under the file's
lock. The header is written (or checked) under flock(), so processes that open a new file
together write it once. Not on NFS, where O_APPEND is not atomic across clients.

Which request served which model comes from the cache's hit and miss events, which run in
the request's task: ``served`` puts the node and model in a contextvar there, and the front
end's accounting reads it when the request ends (``Metrics.request``).
"""

from __future__ import annotations

import asyncio
import contextvars
import csv
import fcntl
import io
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tfscache.observe.requestlog")

COLUMNS = (
    "time",
    "model",
    "version",
    "load_seconds",
    "bytes",
    "node",
    "cold",
    "code",
    "prefetched",
)
# a CSV log written before ``prefetched``: appended to with its own columns
LEGACY_COLUMNS = COLUMNS[:-1]
JSON_SUFFIXES = (".jsonl", ".ndjson")
_BATCH = 1024  # rows taken off the queue at once at most
_WRITE_BYTES = 64 * 1024  # bytes of whole rows per write() at most


@dataclass(frozen=True)
class Served:
    """The model a request holds a lease on, on which node, and whether it waited for the load."""

    node: str
    name: str
    version: int
    cold: bool
    prefetched: bool = False


_served: contextvars.ContextVar[Served | None] = contextvars.ContextVar(
    "tfscache_served", default=None
)


def served(node: str, key: tuple[str, int], cold: bool) -> None:
    """The running request took (or waits for) a lease on ``key`` at ``node``; cold stays set when
    the same request asks again (a node that lost the model: recheck, then a hit)."""
    before = _served.get()
    again = before is not None and (before.node, before.name, before.version) == (node, *key)
    _served.set(Served(node, key[0], key[1], cold or (again and before.cold)))


def prefetched() -> None:
    """The running request is the first for its model since a prefetch loaded it."""
    before = _served.get()
    if before is not None:
        _served.set(Served(before.node, before.name, before.version, before.cold, True))


def forget() -> None:
    """A request starts: nothing served yet."""
    _served.set(None)


def current() -> Served | None:
    """What the running request was served by, if it took a lease on a local node."""
    return _served.get()


class RequestLogError(OSError):
    """The request log cannot be opened or does not fit (the message names the file)."""


class RequestLog:
    """Rows queued by ``write`` (on the event loop) and written to ``path`` by one thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.json_lines = self.path.suffix.lower() in JSON_SUFFIXES
        self._queue: queue.SimpleQueue[dict | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.written = 0  # rows written so far (the writer thread counts)
        self.broken = False  # writing failed: rows are dropped from then on (logged once)
        self.columns = COLUMNS  # a CSV begun with LEGACY_COLUMNS keeps them

    async def start(self) -> None:
        """Open the file (in a thread) and start the writer; RequestLogError if it cannot be used."""
        fd = await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._drain, args=(fd,), name="tfscache-request-log",
                                        daemon=True)
        self._thread.start()
        log.info("request log: %s (%s)", self.path, "JSON lines" if self.json_lines else "CSV")

    def write(self, row: dict) -> None:
        """Queue one row (keys: COLUMNS); never blocks."""
        if self._thread is not None and not self.broken:
            self._queue.put(row)

    async def close(self) -> None:
        """Write what is queued, then close the file."""
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _open(self) -> int:
        """The file's descriptor, opened for appending; the CSV header written or checked under a lock,
        so that processes opening it together write one header."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RequestLogError(
                f"request log {self.path}: cannot open it: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._header(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _header(self, fd: int) -> None:
        if self.json_lines:
            return
        header = ",".join(COLUMNS)
        with open(self.path, "rb") as reader:  # the write-only descriptor cannot read
            first = reader.readline(4096).decode("utf-8", "replace").strip()
        if not first:
            _write_all(fd, (header + "\r\n").encode())
        elif first == ",".join(LEGACY_COLUMNS):
            self.columns = LEGACY_COLUMNS
        elif first != header:
            raise RequestLogError(
                f"request log {self.path}: it exists with other columns ({first[:80]!r}); "
                f"expected {header}: name a new file"
            )

    def _drain(self, fd: int) -> None:
        try:
            while True:
                rows = [self._queue.get()]
                while rows[-1] is not None and len(rows) < _BATCH:
                    try:
                        rows.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                done = rows[-1] is None
                rows = rows[:-1] if done else rows
                for chunk in _chunks([self._format(row) for row in rows]):
                    _write_all(fd, chunk)
                self.written += len(rows)
                if done:
                    return
        except OSError:
            self.broken = True
            log.exception("request log %s: writing failed; no more rows are written", self.path)
        finally:
            os.close(fd)

    def _format(self, row: dict) -> bytes:
        if self.json_lines:
            return (json.dumps(row, separators=(",", ":")) + "\n").encode()
        line = io.StringIO()
        csv.writer(line).writerow([row[c] for c in self.columns])
        return line.getvalue().encode()


def _chunks(rows: list[bytes]) -> list[bytes]:
    """Whole rows joined into writes of at most _WRITE_BYTES (a longer row alone): no row is split."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for row in rows:
        if current and size + len(row) > _WRITE_BYTES:
            chunks.append(b"".join(current))
            current, size = [], 0
        current.append(row)
        size += len(row)
    if current:
        chunks.append(b"".join(current))
    return chunks


def _write_all(fd: int, data: bytes) -> None:
    """One write() of whole rows at the end of the file (O_APPEND); the rest again if the kernel
    took part of it (a full disk, a signal: rare, and only then could another writer's rows come
    between the two parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
