"""The offline bound on load seconds: what the best possible cache would spend on a node's requests.

Every cache here (each policy, Belady's MIN, the cache manager) serves a request from a
resident model, loading it first on a miss at that request's ``load_seconds``. Between two
requests ``i < j`` for one model, a cache either keeps the model resident the whole time
(request ``j`` is a hit) or pays ``load_seconds[j]`` at ``j``: evicting and reloading in
between only costs more. So a schedule is a choice of *kept intervals*, and its cost is
the first request of each model (compulsory) plus every interval not kept. At request
``x`` the requested model takes its room, and every interval strictly around ``x`` takes
its model's room, within the cap.

That is a min-cost flow over the request sequence (weighted paging; Chrobak et al.'s
formulation of the offline problem). Boundary nodes ``b_0 .. b_m`` sit between the
``m`` requests; a flow of ``CAP`` units (``max_models`` slots or ``memory_bytes`` bytes)
runs from ``b_0`` to ``b_m``:

* a *chain* edge ``b_x -> b_{x+1}`` carries the room left free at request ``x``; its
  lower bound is the room the requested model takes (1 slot, or its bytes);
* an *interval* edge ``b_{i+1} -> b_j`` (capacity: the model's room) carries the room a
  kept model holds across the requests between ``i`` and ``j``; each unit saves
  ``load_seconds[j] / room``.

Flow conservation makes the room held at every request plus the requested model's own
at most ``CAP``. The constraint matrix of a flow problem is totally unimodular:

* **count cap** (every room is 1): the linear program has an integral optimal vertex,
  which the dual simplex method returns; it is the exact optimum, a real schedule
  (``exact`` is True, checked on the solution);
* **memory cap**: a model may be kept *in part* (a fraction of its bytes saving that
  fraction of its reload). That is the LP relaxation of generalised caching (the
  "fractional optimum"); every real schedule is one of its solutions, so it is a lower
  bound on any cache's load seconds, not a schedule (``exact`` False). Its integrality
  gap can be large when a few models are a big share of the cap (Bar-Noy et al. 2001);
  it is tight when models are small against the cap;
* **both caps**: the larger of the two bounds (each holds alone).

A model larger than the memory cap is never cached, as in the simulator (it counts
neither as a request here nor as load seconds). Solved with SciPy's HiGHS (``linprog``,
dual simplex), in time roughly linear to quadratic in the node's requests; ``MAX_REQUESTS``
is the default cut-off beyond which ``tfscache simulate`` does not try.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_REQUESTS = 50_000
"""Default cut-off: a log of more requests gets no bound (``tfscache simulate --bound-max-requests``).

At 50,000 requests one node count and caps solves in 1-13 s on the build VM, so the default
keeps a simulation of many configurations within a minute or two; a 100,000-request log on
2 nodes takes 10-30 s per configuration, and can be asked for with a higher limit."""

_INTEGRAL = 1e-6

# (key, time, bytes, load seconds, ...): the engine's Request; only the first four are read.
Row = Sequence


@dataclass(frozen=True)
class Bound:
    """A node's (or, summed, a cluster's) bound on load seconds."""

    load_seconds: float
    exact: bool
    """True: the offline optimum itself (count caps); False: a lower bound (memory caps)."""

    def __add__(self, other: Bound) -> Bound:
        return Bound(self.load_seconds + other.load_seconds, self.exact and other.exact)


def cluster_bound(
    per_node: Sequence[Sequence[Row]], max_models: int = 0, memory_bytes: int = 0
) -> Bound:
    """The sum of every node's bound (nodes share nothing: each is solved alone)."""
    total = Bound(0.0, True)
    for requests in per_node:
        total = total + node_bound(requests, max_models, memory_bytes)
    return total


def node_bound(requests: Sequence[Row], max_models: int = 0, memory_bytes: int = 0) -> Bound:
    """The bound on load seconds for one node's requests (in order) under its caps (0: no cap)."""
    if memory_bytes:
        # room as a share: well scaled
        memory = _solve(requests, 1.0, lambda size: size / memory_bytes, memory_bytes)
        if not max_models:
            return Bound(memory.load_seconds, False)
        count = _solve(requests, max_models, lambda size: 1, memory_bytes)
        return Bound(max(memory.load_seconds, count.load_seconds), False)
    return _solve(requests, max_models, lambda size: 1, 0)


def _solve(requests: Sequence[Row], cap: int, room, memory_bytes: int) -> Bound:
    """Min-cost flow with room ``room(bytes)`` per model and ``cap`` room in all."""
    points = [
        (key, size, cost)
        for key, _, size, cost, *_ in requests
        if not (memory_bytes and size > memory_bytes)
    ]
    last: dict = {}  # key -> index of its latest request among points
    compulsory = 0.0
    tail, head, weight, upper = [], [], [], []  # interval edges
    for x, (key, size, cost) in enumerate(points):
        i = last.get(key)
        last[key] = x
        if i is None:
            compulsory += cost
        # back to back is always a hit; a free reload is never worth room
        elif i + 1 < x and cost > 0:
            held = room(points[i][1])
            if held > 0:
                tail.append(i + 1)
                head.append(x)
                weight.append(cost / held)
                upper.append(held)
    reloads = sum(w * u for w, u in zip(weight, upper))
    if not tail or not cap:
        return Bound(compulsory + (reloads if cap else 0.0), True)
    saved, integral = _max_savings(len(points), [room(size) for _, size, _ in points], cap,
                                   tail, head, weight, upper)
    return Bound(max(compulsory, compulsory + reloads - saved), integral)


def _max_savings(m, need, cap, tail, head, weight, upper) -> tuple[float, bool]:
    """The most load seconds the kept intervals can save; whether the optimum found is integral."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import csr_array

    k = len(tail)
    # variables: chain edges 0..m-1 (b_x -> b_{x+1}), then interval edges; rows: nodes b_0..b_m
    rows = np.concatenate([np.arange(m), np.arange(1, m + 1), np.asarray(tail), np.asarray(head)])
    cols = np.concatenate([np.arange(m), np.arange(m), np.arange(m, m + k), np.arange(m, m + k)])
    vals = np.concatenate([-np.ones(m), np.ones(m), -np.ones(k), np.ones(k)])
    a_eq = csr_array((vals, (rows, cols)), shape=(m + 1, m + k))
    b_eq = np.zeros(m + 1)
    b_eq[0], b_eq[m] = -cap, cap
    lower = np.concatenate([np.minimum(np.asarray(need, dtype=float), cap), np.zeros(k)])
    bounds = np.column_stack(
        [lower, np.concatenate([np.full(m, float(cap)), np.asarray(upper, dtype=float)])]
    )
    objective = np.concatenate([np.zeros(m), -np.asarray(weight)])
    result = linprog(objective, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs-ds")
    if result.status != 0:
        raise RuntimeError(f"the bound's linear program failed: {result.message}")
    kept = result.x[m:] / np.asarray(upper, dtype=float)
    integral = bool(np.all(np.minimum(np.abs(kept), np.abs(kept - 1)) < _INTEGRAL))
    return -float(result.fun), integral
