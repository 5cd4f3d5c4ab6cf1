"""The last few hundred things the caches did, for the status page: a bounded ring buffer.

``NodeEvents`` (tfscache.observe.metrics) records each load, failed load, eviction and unload a
node's CacheManager reports; ``/status/events`` (tfscache.observe.server) serves them as JSON::

    {"seq": 42,            # the newest event's sequence number (0 before any)
     "size": 500,          # how many the buffer keeps; older ones are dropped
     "dropped": 0,         # events between ``since`` and the oldest kept (the client missed them)
     "events": [{"seq": 41, "time": 1767225600.0, "node": "node0", "kind": "evicted",
                 "model": "a", "version": 1, "reason": "capacity", "bytes": 240000,
                 "seconds": null}, ...]}           # oldest first

``kind`` is an open string (loaded, load_failed, evicted, unloaded today; a demotion can be one
more): a reader shows kinds it does not know as they are. ``seconds``: the load's or unload's
duration (null for an eviction), ``reason``: the eviction's reason or the failure's message.
Sequence numbers start at 1 and grow by one per event, so ``since=SEQ`` returns exactly those
recorded after SEQ (``dropped`` says how many of them the bound already lost).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

SIZE = 500


class Timeline:
    """A ring buffer of the newest ``size`` cache events, each with its sequence number."""

    def __init__(self, size: int = SIZE, clock: Callable[[], float] = time.time) -> None:
        if size < 1:
            raise ValueError(f"a timeline keeps at least 1 event, got size={size}")
        self.size = size
        self._clock = clock
        self._events: deque[dict[str, Any]] = deque(maxlen=size)
        self.seq = 0

    def record(self, node: str, kind: str, model: str, version: int, *, reason: str | None = None,
               size: int | None = None, seconds: float | None = None) -> None:
        """One event, now (on the event loop: cheap, never raises on its inputs)."""
        self.seq += 1
        self._events.append({
            "seq": self.seq, "time": self._clock(), "node": node, "kind": kind, "model": model,
            "version": version, "reason": reason, "bytes": size,
            "seconds": None if seconds is None else round(seconds, 6),
        })

    def since(self, seq: int = 0) -> dict[str, Any]:
        """The document of the events after ``seq`` (every kept one for 0), oldest first."""
        document: dict[str, Any] = {"seq": self.seq, "size": self.size, "dropped": 0, "events": []}
        if seq < self.seq:  # something new (a deque of at most ``size``: a scan is cheap)
            document["events"] = [e for e in self._events if e["seq"] > seq]
            document["dropped"] = max(0, self._events[0]["seq"] - seq - 1)
        return document
