"""Copies that follow load: consistent hashing with bounded loads, extra copies that cool down.

A model's copies are always a *prefix* of its ring order (``Ring.order``): the first
``min_copies`` nodes (``ring.replicas_per_model``) always, then extra copies on the next
nodes, up to ``max_copies``. Every front end (each sidecar) applies the same rule to the
same ring, so two front ends that both spread a model spread it onto the same nodes: the
union of their copies is the longer of two prefixes, never more than ``max_copies`` nodes.

Routing (``Copies.pick``), after Mirrokni, Thorup and Zadimoghaddam's bounded loads:

* a node's *load* is what this front end knows of it, by ``signal``: ``rate`` (the
  default) counts the requests sent to the node over the last ``rate_window_s``
  (exponentially decayed); ``inflight`` counts its requests in flight (its own, and for a
  sidecar's own node every request that node serves, forwarded ones included); a peer's
  report of its own node's load (``report``, sent back on forwarded responses) counts too,
  the larger of the two;
* a node is *under its bound* while ``load < max(min_load, (1 + balance) x (total + 1) /
  nodes)``: at most ``1 + balance`` times the mean once this request is counted (rounded
  up for in-flight counts), and never "over" below ``min_load``;
* a request goes to its model's first copy (ring order; copies that hold the model
  first) under its bound;
* when every copy is over, a *hot* model gains the next ring node as an extra copy, and
  the request goes there (the node's cache loads the model like any other miss, under its
  caps, evicting only idle models). Hot means, by signal: its own rate per copy is at
  least ``hot_share`` of a mean node's rate, or it has at least ``hot_inflight`` requests in
  flight per copy. A model that is not hot goes to its least loaded copy: a cold model
  never costs a second load because a node is briefly busy.

Cooling down (``Copies.expire``): an extra copy that received no request for ``cool_s``
seconds is dropped, the last one in ring order first (copies stay a prefix). Adding is at
once, dropping after a long quiet time: that is the hysteresis that keeps copies from
flapping. The copy's model stays resident where it was until its node's cache evicts it
(``CopyReaper`` in tfscache/cluster/reaper.py evicts idle extra copies on local nodes; a
lease in flight makes the cache refuse, so removal waits for in-flight requests).

Deciding only: no I/O, an injectable clock. The router (live) and ``tfscache simulate``
(tfscache/sim/load.py) call the same class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CopyRule:
    """The rule's knobs (settings section ``[copies]``; docs/copies.md gives the reasoning)."""

    enabled: bool = True
    min_copies: int = 1
    max_copies: int = 4  # 0: every node on the ring
    balance: float = 0.1
    min_load: float = 10.0
    # inflight signal: a model is hot with this many requests in flight per copy
    hot_inflight: float = 2.0
    cool_s: float = 600.0
    signal: str = "rate"  # or "inflight"
    rate_window_s: float = 10.0
    # rate signal: a model is hot at this share of a mean node's rate per copy
    hot_share: float = 0.5


@dataclass(frozen=True)
class Choice:
    """Where one request goes: ``node``; ``spilled`` when its first copy was over its bound,
    ``added`` when this request made ``node`` a new extra copy."""

    node: str
    spilled: bool = False
    added: bool = False


class Copies:
    """Per front end: each model's copies, in-flight requests per (model, node), last use of extras."""

    def __init__(self, rule: CopyRule, clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule
        self.clock = clock
        self._extra: dict[str, list[str]] = {}  # model -> extra copies, in ring order
        # (model, extra node) -> last request sent there
        self._used: dict[tuple[str, str], float] = {}
        self._inflight: dict[tuple[str, str], int] = {}  # (model, node) -> requests in flight
        self._node_load: dict[str, int] = {}  # node -> requests in flight (all models)
        # node -> (load its front end reported, when)
        self._reported: dict[str, tuple[float, float]] = {}
        # node or (model, node) -> (decayed count, when)
        self._rates: dict[object, tuple[float, float]] = {}
        self.added = 0  # copies added and removed since start (metrics read these)
        self.removed = 0
        self.spills = 0

    # -- reading -------------------------------------------------------------------------

    def copies(self, model: str, order: Sequence[str]) -> list[str]:
        """The model's copies now: the first ``min_copies`` of ``order``, then its extra copies
        still on the ring (a prefix of ``order``)."""
        base = list(order[:self.rule.min_copies])
        extra = self._extra.get(model, ())
        for node in order[len(base):]:
            if node not in extra:
                break
            base.append(node)
        return base

    def extras(self) -> dict[str, list[str]]:
        """Every model with extra copies: model -> its extra nodes (in ring order)."""
        return {model: list(nodes) for model, nodes in self._extra.items() if nodes}

    def is_extra(self, model: str, node: str) -> bool:
        return node in self._extra.get(model, ())

    def load(self, node: str) -> float:
        """``node``'s load as this front end knows it: requests in flight (a fresh peer report
        counts), or with the rate signal its requests over the last ``rate_window_s`` (decayed)."""
        reported = self.reported(node)
        own = self.rate(node) if self.rule.signal == "rate" else self._node_load.get(node, 0)
        return own if reported is None else max(own, reported)

    def reported(self, node: str) -> float | None:
        """What ``node``'s own front end last reported of its load (``report``), as it stands now:
        a rate decays as the node's own would (no request since the report); an in-flight count
        holds for ``_REPORT_TTL_S``. None: no report (or an in-flight one gone stale)."""
        report = self._reported.get(node)
        if report is None:
            return None
        load, when = report
        if self.rule.signal == "rate":
            return load * math.exp(-(self.clock() - when) / self.rule.rate_window_s)
        return load if self.clock() - when <= _REPORT_TTL_S else None

    def rate(self, key) -> float:
        """Requests sent to ``key`` (a node, or a (model, node) pair) over the rate window, decayed."""
        value, when = self._rates.get(key, (0.0, 0.0))
        return value * math.exp(-(self.clock() - when) / self.rule.rate_window_s) if value else 0.0

    def _count(self, key) -> None:
        self._rates[key] = (self.rate(key) + 1.0, self.clock())

    def inflight(self, model: str, node: str) -> int:
        return self._inflight.get((model, node), 0)

    def last_used(self, model: str, node: str) -> float | None:
        """When this front end last sent ``model`` to ``node`` as an extra copy (clock seconds)."""
        return self._used.get((model, node))

    # -- deciding ------------------------------------------------------------------------

    def bound(self, nodes: Iterable[str]) -> float:
        """The load under which a node still takes one more request."""
        nodes = list(nodes)
        total = sum(self.load(n) for n in nodes)
        bound = (1 + self.rule.balance) * (total + 1) / max(1, len(nodes))
        return max(
            self.rule.min_load, math.ceil(bound) if self.rule.signal == "inflight" else bound
        )

    def pick(self, model: str, order: Sequence[str], ring: Sequence[str] | None = None,
             usable: Callable[[str], bool] = lambda node: True,
             rank: Callable[[str], object] | None = None) -> Choice:
        """Where the next request for ``model`` goes, given its ring order (every node, or at least
        ``max_copies``) and the ring's nodes (default: ``order``); ``usable(node)`` False skips a
        node (unhealthy); ``rank`` orders the copies before the bound is checked (stable: ring
        order within a rank; the router puts copies that hold the model first). Records nothing
        but an added copy (and the spill counts): call ``begin``/``end``."""
        choice = self.choose(model, order, ring, usable, rank)
        if choice.spilled:
            self.spills += 1
        if choice.added:
            self._extra.setdefault(model, []).append(choice.node)
            self._used[(model, choice.node)] = self.clock()
            self.added += 1
        return choice

    def choose(self, model: str, order: Sequence[str], ring: Sequence[str] | None = None,
               usable: Callable[[str], bool] = lambda node: True,
               rank: Callable[[str], object] | None = None) -> Choice:
        """What ``pick`` would answer now, recording nothing (the data plane asks it of a model
        HAProxy routes: tfscache.dataplane.targets)."""
        if not order:
            raise ValueError("pick: empty ring order")
        copies = self.copies(model, order)
        live = [n for n in copies if usable(n)] or copies
        if rank is not None:
            live.sort(key=rank)
        if not self.rule.enabled:
            return Choice(live[0])
        nodes = ring if ring is not None else order
        bound = self.bound(nodes)
        for node in live:
            if self.load(node) < bound:
                return Choice(node, spilled=node != live[0])
        limit = min(self.rule.max_copies or len(order), len(order))
        if len(copies) < limit and self._hot(model, copies, nodes) and usable(order[len(copies)]):
            return Choice(order[len(copies)], spilled=True, added=True)
        return Choice(min(live, key=self.load))

    def _hot(self, model: str, copies: Sequence[str], nodes: Sequence[str]) -> bool:
        if self.rule.signal == "rate":
            mean = sum(self.rate(n) for n in nodes) / max(1, len(nodes))
            return sum(self.rate((model, n)) for n in copies) >= self.rule.hot_share * mean * len(
                copies
            )
        own = sum(self.inflight(model, n) for n in copies)
        return own >= self.rule.hot_inflight * len(copies)

    # -- recording -----------------------------------------------------------------------

    def begin(self, model: str, node: str) -> None:
        """A request for ``model`` was sent to ``node``."""
        key = (model, node)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        self._node_load[node] = self._node_load.get(node, 0) + 1
        if self.rule.signal == "rate":
            self._count(node)
            self._count(key)
        if key in self._used:
            self._used[key] = self.clock()

    def end(self, model: str, node: str) -> None:
        """That request finished (answered, failed or cancelled)."""
        key = (model, node)
        left = self._inflight.get(key, 0) - 1
        if left > 0:
            self._inflight[key] = left
        else:
            self._inflight.pop(key, None)
        self._node_load[node] = max(0, self._node_load.get(node, 0) - 1)
        if key in self._used:
            self._used[key] = self.clock()

    def report(self, node: str, load: float) -> None:
        """``node``'s own front end said its load is ``load`` (in this rule's signal: a rate, or
        requests in flight); ``load(node)`` takes the larger of that and what is known here."""
        self._reported[node] = (max(0.0, load), self.clock())

    def expire(self) -> list[tuple[str, str]]:
        """Drop extra copies idle for ``cool_s`` (the last in ring order first, one at a time per
        model, and never one with requests in flight); the (model, node) pairs dropped."""
        now, dropped = self.clock(), []
        for model, nodes in list(self._extra.items()):
            while nodes:
                node = nodes[-1]
                key = (model, node)
                if self._inflight.get(key) or now - self._used.get(key, now) < self.rule.cool_s:
                    break
                nodes.pop()
                self._used.pop(key, None)
                self.removed += 1
                dropped.append(key)
            if not nodes:
                del self._extra[model]
        return dropped


_REPORT_TTL_S = 2.0  # a peer's reported load counts this long
