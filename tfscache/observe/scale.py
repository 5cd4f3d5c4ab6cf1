"""The scaling signal: capacity unloads per minute per node, and a scale advice.

An *unload* here is a model taken off a node because a cap needed room (the cache's
``evicted(key, "capacity")`` event): the cost of too few nodes. Drains, admin evictions
and models gone from the repository are not counted: more nodes would not avoid them.

``UnloadRate`` counts them per node over a sliding window (``scale.window_s``, default
5 minutes): the rate is the count in the window x 60 / window, from the process's start
on (so it reads low during the first window, never high).

``advise(nodes, settings)`` is pure and reads what the local nodes hold now:

* **+1** (more nodes): the mean of the nodes' unloads per minute is at or above
  ``scale.unloads_per_minute_high``;
* **-1** (fewer nodes): with at least two nodes, all healthy, the mean rate at or below
  ``scale.unloads_per_minute_low``, and the resident set (loading + available versions and
  their bytes, summed over the nodes) fits under ``(1 - scale.headroom)`` x the caps of the
  nodes less the largest one, for every cap the nodes have (count, memory; at least one);
* **0** (hold) otherwise; the reason says which rule held it.

A sidecar sees one node, so it never advises fewer: across sidecars the same rule is
PromQL over every sidecar's gauges (deploy/k8s/keda/scaledobject.yaml, docs/scaling.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MORE, HOLD, FEWER = 1, 0, -1


class UnloadRate:
    """Capacity unloads per node in a sliding window of ``window_s`` seconds (times from ``clock``)."""

    def __init__(
        self, window_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._times: dict[str, deque[float]] = {}

    def record(self, node: str) -> None:
        """One capacity unload on ``node``, now."""
        now = self._clock()
        times = self._times.setdefault(node, deque())
        times.append(now)
        self._expire(times, now)

    def per_minute(self, node: str) -> float:
        """``node``'s unloads per minute over the window that ends now (0.0 for a node with none)."""
        times = self._times.get(node)
        if not times:
            return 0.0
        self._expire(times, self._clock())
        return len(times) * 60.0 / self.window_s

    def _expire(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()


@dataclass(frozen=True)
class NodeLoad:
    """What the advice reads of one local node."""

    name: str
    unloads_per_minute: float
    models: int  # loading + available versions (what counts against the caps)
    bytes: int
    max_models: int  # 0: no cap
    memory_bytes: int  # 0: no cap
    healthy: bool = True


@dataclass(frozen=True)
class Advice:
    """+1 more nodes, 0 hold, -1 fewer; ``reason`` in words (for /status and `tfscache status`)."""

    value: int
    reason: str


def advise(nodes: Sequence[NodeLoad], scale: Any) -> Advice:
    """The advice for ``nodes`` under the thresholds of ``scale`` (the settings' scale section)."""
    if not nodes:
        return Advice(HOLD, "no local node")
    rate = sum(n.unloads_per_minute for n in nodes) / len(nodes)
    if rate >= scale.unloads_per_minute_high:
        return Advice(
            MORE, f"{rate:.1f} unloads per minute per node >= {scale.unloads_per_minute_high:g}"
        )
    if rate > scale.unloads_per_minute_low:
        return Advice(
            HOLD, f"{rate:.1f} unloads per minute per node > {scale.unloads_per_minute_low:g}"
        )
    if len(nodes) < 2:
        return Advice(HOLD, "one node (fewer is decided across sidecars: docs/scaling.md)")
    if not all(n.healthy for n in nodes):
        return Advice(HOLD, "a node is down")
    return _fits_on_fewer(nodes, 1.0 - scale.headroom)


def _fits_on_fewer(nodes: Sequence[NodeLoad], share: float) -> Advice:
    checked = []
    for what, used, caps in (
        ("models", sum(n.models for n in nodes), [n.max_models for n in nodes]),
        ("bytes", sum(n.bytes for n in nodes), [n.memory_bytes for n in nodes]),
    ):
        if not all(caps):
            continue  # a node without this cap: fewer nodes are not bounded by it
        room = share * (sum(caps) - max(caps))
        if used > room:
            return Advice(
                HOLD,
                f"{used} {what} resident need more than {room:.0f} (one node fewer, with headroom)",
            )
        checked.append(f"{used} {what} <= {room:.0f}")
    if not checked:
        return Advice(
            HOLD,
            "no caps: the resident set fits anywhere, the node count is not the cache's to judge",
        )
    return Advice(FEWER, f"fits on one node fewer with headroom ({', '.join(checked)})")
