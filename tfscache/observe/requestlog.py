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
queued on the event loop and written by one thread, flushed after each batch: the event
loop never waits for the disk.

Which request served which model comes from the cache's hit and miss events, which run in
the request's task: ``served`` puts the node and model in a contextvar there, and the front
end's accounting reads it when the request ends (``Metrics.request``).
"""

from __future__ import annotations

import asyncio
import contextvars
import csv
import io
import json
import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tfscache.observe.requestlog")

COLUMNS = ("time", "model", "version", "load_seconds", "bytes", "node", "cold", "code", "prefetched")
LEGACY_COLUMNS = COLUMNS[:-1]  # a CSV log written before ``prefetched``: appended to with its own columns
JSON_SUFFIXES = (".jsonl", ".ndjson")
_BATCH = 1024  # rows written between flushes at most


@dataclass(frozen=True)
class Served:
    """The model a request holds a lease on, on which node, and whether it waited for the load."""

    node: str
    name: str
    version: int
    cold: bool
    prefetched: bool = False


_served: contextvars.ContextVar[Served | None] = contextvars.ContextVar("tfscache_served", default=None)


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
        stream = await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._drain, args=(stream,), name="tfscache-request-log",
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

    def _open(self) -> io.TextIOBase:
        try:
            stream = open(self.path, "a+", encoding="utf-8", newline="")
        except OSError as exc:
            raise RequestLogError(f"request log {self.path}: cannot open it: {exc.strerror or exc}") from exc
        try:
            stream.seek(0)
            first = stream.readline().strip()
            if not first and not self.json_lines:
                stream.write(",".join(COLUMNS) + "\r\n")
            elif first and not self.json_lines and first == ",".join(LEGACY_COLUMNS):
                self.columns = LEGACY_COLUMNS
            elif first and not self.json_lines and first != ",".join(COLUMNS):
                raise RequestLogError(f"request log {self.path}: it exists with other columns ({first[:80]!r}); "
                                      f"expected {','.join(COLUMNS)}: name a new file")
            stream.seek(0, io.SEEK_END)
            stream.flush()
        except BaseException:
            stream.close()
            raise
        return stream

    def _drain(self, stream: io.TextIOBase) -> None:
        writer = csv.writer(stream)
        try:
            while True:
                rows = [self._queue.get()]
                while rows[-1] is not None and len(rows) < _BATCH:
                    try:
                        rows.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                done = rows[-1] is None
                for row in rows[:-1] if done else rows:
                    if self.json_lines:
                        stream.write(json.dumps(row, separators=(",", ":")) + "\n")
                    else:
                        writer.writerow([row[c] for c in self.columns])
                    self.written += 1
                stream.flush()
                if done:
                    return
        except OSError:
            self.broken = True
            log.exception("request log %s: writing failed; no more rows are written", self.path)
        finally:
            stream.close()
