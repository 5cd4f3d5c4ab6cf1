"""Workers' usage reports, applied in the control process (tfscache.workers.control).

Every <= 100 ms each worker reports, per node version it served under a delegation, the requests
since its last report, the last use and the requests still in flight. Here they go:

* to the node's cache: the requests (``CacheManager.used_elsewhere``), each as a lease taken and
  given back, for the policy's recency and counts (LRU, LFU, GDSF) and the entry's last use; and
  the requests in flight (``CacheManager.in_flight_elsewhere``): a version busy in a worker is no
  victim for capacity, as a leased one is not;
* with copies on (docs/copies.md), to the copies rule (``Copies.begin``/``end``), so that its load
  signal (in flight, or the request rate) counts delegated requests as if they had been routed here.
  A worker's in-flight counts are kept per worker and taken back when it dies.

``moved()`` then says which delegated (node, model) pairs the router would no longer send to that
node alone (the ring changed, or the copies rule would now spread the model: an extra copy, or
another node picked first): the control process revokes those delegations, so that those requests
are routed by the control process again, request by request.
"""

from __future__ import annotations

from collections.abc import Callable

from tfscache import errors
from tfscache.frontend.backends import NodeBackend
from tfscache.frontend.methods import RouteKey

# (worker, node, model) -> requests in flight as last reported
_InFlight = dict[tuple[int, str, str], int]


class Usage:
    """Applies reports to caches and (copies on) to the copies rule."""

    def __init__(self, nodes: Callable[[], dict], spread=None) -> None:
        """``nodes()``: local node backends by name; ``spread``: tfscache.cluster.spread.Spread or None."""
        self._nodes = nodes
        self._spread = spread
        self._in_flight: _InFlight = {}  # copies on: what was counted into the copies rule
        # worker -> node version -> in flight
        self._reported: dict[int, dict[tuple[str, str, int], int]] = {}

    def apply(self, worker: int, rows: list) -> set[tuple[str, str]]:
        """One report's rows ``[node, name, version, requests, last_use, in_flight]``; returns the
        (node, model) pairs it named."""
        nodes, seen = self._nodes(), set()
        reported: dict[tuple[str, str], int] = {}
        before = self._reported.get(worker, {})
        self._reported[worker] = {
            (node, name, version): in_flight
            for node, name, version, _, _, in_flight in rows
            if in_flight
        }
        self._tell_caches(nodes, before.keys() | self._reported[worker].keys())
        for node, name, version, requests, last_use, in_flight in rows:
            backend = nodes.get(node)
            if backend is not None and backend.cache is not None and requests:
                backend.cache.used_elsewhere(name, version, requests, last_use)
            seen.add((node, name))
            reported[(node, name)] = reported.get((node, name), 0) + in_flight
            if self._spread is not None:
                self._count(worker, node, name, requests, reported[(node, name)])
        if self._spread is not None:  # pairs no longer in its report: nothing in flight there now
            for w, node, name in [
                k for k in self._in_flight if k[0] == worker and k[1:] not in reported
            ]:
                self._count(w, node, name, 0, 0)
        return seen

    def _count(self, worker: int, node: str, name: str, requests: int, in_flight: int) -> None:
        copies = self._spread.copies
        key = (worker, node, name)
        before = self._in_flight.get(key, 0)
        delta = in_flight - before
        for _ in range(max(delta, 0)):  # requests that started and are still running
            copies.begin(name, node)
        for _ in range(max(requests - max(delta, 0), 0)):  # requests that started and finished
            copies.begin(name, node)
            copies.end(name, node)
        for _ in range(max(-delta, 0)):
            copies.end(name, node)
        if in_flight:
            self._in_flight[key] = in_flight
        else:
            self._in_flight.pop(key, None)

    def worker_gone(self, worker: int) -> None:
        """A dead worker's requests are in flight no more."""
        self._tell_caches(self._nodes(), self._reported.pop(worker, {}).keys())
        if self._spread is None:
            return
        for (w, node, name) in [k for k in self._in_flight if k[0] == worker]:
            self._count(w, node, name, 0, 0)

    def _tell_caches(self, nodes: dict, helds) -> None:
        """Each node version's requests in flight in all workers, to its cache (the planner's idleness)."""
        for held in helds:
            backend = nodes.get(held[0])
            if backend is not None and backend.cache is not None:
                backend.cache.in_flight_elsewhere(held[1], held[2], self.in_flight(held))

    def in_flight(self, held: tuple[str, str, int]) -> int:
        """Requests on node version ``held`` in flight in the workers, as they last reported."""
        return sum(counts.get(held, 0) for counts in self._reported.values())

    def moved(self, pairs, router) -> list[tuple[str, str]]:
        """Of delegated (node, model) ``pairs``, those the router would not now send to that node
        alone: the ring changed (another node first), or copies spread the model (an extra copy, or
        another node picked first: with copies on this is asked as one request routed now would ask).
        """
        moved = []
        for node, name in pairs:
            try:
                candidates = router.candidates(RouteKey(name))
            except errors.TfscacheError:
                moved.append((node, name))
                continue
            if not candidates or candidates[0].name != node or self.spread_over(name, router) > 1:
                moved.append((node, name))
        return moved

    def spread_over(self, name: str, router) -> int:
        """How many nodes hold copies of ``name`` now (1 without copies)."""
        if self._spread is None:
            return 1
        ring = router.ring
        return len(
            self._spread.copies.copies(name, ring.order(name, self._spread.rule.max_copies or None))
        )


def sole_resident(router, usage: Usage, name: str, asked: int | None
                  ) -> tuple[NodeBackend, int] | None:
    """The local node and version that alone would serve a request for ``name`` at ``asked``
    (None: latest) warm now: the router's first choice, healthy, not draining, the version
    AVAILABLE there, copies not spread. None otherwise. What a worker's delegation may be given
    (tfscache.workers.control), and a data plane's route with copies off
    (tfscache.dataplane.targets; with copies on it routes over the copies)."""
    try:
        candidates = router.candidates(RouteKey(name, asked))
    except errors.TfscacheError:
        return None
    backend = candidates[0] if candidates else None
    if not isinstance(backend, NodeBackend):
        return None
    cache = backend.cache
    if cache is None or backend.upstream is None or cache.draining or not cache.healthy:
        return None
    version = cache.resident_version(name, asked)  # READY (AVAILABLE on the node)
    if version is None or usage.spread_over(name, router) > 1:
        return None
    return backend, version
