"""The live side of copies that follow load: the router asks ``Spread`` where a request goes.

``Spread`` wraps the pure rule (``tfscache.cluster.copies.Copies``) for one front end:

* ``candidates(key, ring, backends)``: the backends to try for a request, best first: the
  copy the rule picks (an extra copy when every copy is over its bound and the model is
  hot), then the model's other copies, healthy and resident ones first;
* ``serving(model, node)``: held around every request sent to a node or peer (forwarded
  ones served by a sidecar's own node included), so the rule sees each node's requests in
  flight;
* ``sweep()`` (every ``copies.sweep_s`` from ``run()``): drops extra copies that cooled
  down and asks each *local* node's cache to unload a model that is none of its copies
  (not among the model's first ``ring.replicas_per_model`` nodes, not an extra copy here),
  idle for ``cool_s``: an extra copy another sidecar added, one this front end dropped,
  one left by a ring change. The cache refuses a model with a lease or a pin
  (``FailedPrecondition``): removal waits for in-flight requests, and pins hold. A local
  node that is not on the ring (drained, a sidecar not joined yet, prewarmed before its
  join) is left alone. The local nodes and the ring come from ``watch`` (the topology's),
  so a sidecar that only serves its peers' forwards, and never routes, still sweeps.

Counted per node for the metrics (``CopiesCollector`` in tfscache/cluster/copymetrics.py):
spills (a request sent past its model's first copy by load), copies added and removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from tfscache import errors
from tfscache.cluster.copies import Copies, CopyRule

log = logging.getLogger("tfscache.cluster.spread")


class Spread:
    """Extra copies of busy models for one front end, and their cool-down on its local nodes."""

    def __init__(
        self, rule: CopyRule, *, sweep_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.copies = Copies(rule, clock)
        self.clock = clock
        self.sweep_s = sweep_s
        self.spills: dict[str, int] = {}  # node -> requests spilled to it
        self.added: dict[str, int] = {}  # node -> extra copies added on it
        self.removed: dict[str, int] = {}  # node -> extra copies dropped from it
        # local node -> copies its cache unloaded after cooling down
        self.unloaded: dict[str, int] = {}
        # (model, local node) -> last request there ended
        self._served: dict[tuple[str, str], float] = {}
        self._ring = None
        self._local: Callable[[], Mapping[str, object]] = dict
        self._ring_now: Callable[[], object] | None = None

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Read time from ``clock`` from now on (tests drive the cool-down with a fake one)."""
        self.clock = self.copies.clock = clock

    @property
    def rule(self) -> CopyRule:
        return self.copies.rule

    def candidates(
        self, key, ring, backends: Mapping[str, object], local: str | None = None
    ) -> list:
        """Backends for ``key`` (a RouteKey), best first; the rule's pick leads."""
        order = self._order(key, ring)
        choice = self.copies.pick(key.name, order, ring.nodes, **_judged(key, backends, local))
        if choice.spilled:
            self.spills[choice.node] = self.spills.get(choice.node, 0) + 1
        if choice.added:
            self.added[choice.node] = self.added.get(choice.node, 0) + 1
            log.info(
                "model %s: extra copy on %s (every copy over its bound)", key.name, choice.node
            )
        copies = self.copies.copies(key.name, order)
        rest = sorted((backends[n] for n in copies if n != choice.node),
                      key=lambda b: (not b.healthy, b.name != local and not b.holds(key)))
        return [backends[choice.node], *rest]

    def choice(
        self, key, ring, backends: Mapping[str, object], local: str | None = None
    ) -> tuple[list[str], object]:
        """(``key``'s copies in ring order, the rule's pick for a request now), recording nothing:
        what ``candidates`` would do. The data plane asks it of the models HAProxy routes."""
        order = self._order(key, ring)
        choice = self.copies.choose(key.name, order, ring.nodes, **_judged(key, backends, local))
        return self.copies.copies(key.name, order), choice

    def _order(self, key, ring) -> list[str]:
        self._ring = ring
        order = ring.order(key.name, self.rule.max_copies or None)
        if not order:
            raise errors.NodeUnavailable("no nodes in the ring")
        return order

    @contextlib.contextmanager
    def serving(self, model: str, node: str):
        """Hold around one request sent to ``node``: it counts as in flight there."""
        self.copies.begin(model, node)
        try:
            yield
        finally:
            self.copies.end(model, node)
            self._served[(model, node)] = self.clock()

    def counts(self) -> dict[str, list[str]]:
        """Every model with extra copies here: model -> its copies (ring order), for status."""
        ring = self._current_ring()
        out = {}
        for model, extra in self.copies.extras().items():
            base = list(ring.replicas_for(model)) if ring is not None else []
            out[model] = [*base, *(n for n in extra if n not in base)]
        return out

    def watch(self, local: Callable[[], Mapping[str, object]],
              ring: Callable[[], object] | None = None) -> None:
        """Where ``sweep`` finds the local nodes (name -> NodeBackend, its ``cache``) and the ring
        now (the topology's). Without ``ring`` the sweep knows only the ring of the last request
        routed here: a sidecar whose node serves only its peers' forwarded requests would never
        unload the extra copies they add on it."""
        self._local = local
        self._ring_now = ring

    def _current_ring(self):
        return self._ring_now() if self._ring_now is not None else self._ring

    async def sweep(self) -> list[tuple[str, str]]:
        """Drop cooled extra copies, then unload idle non-copies from local nodes; what was unloaded."""
        for model, node in self.copies.expire():
            self.removed[node] = self.removed.get(node, 0) + 1
            log.info("model %s: extra copy on %s cooled down", model, node)
        ring, now, unloaded = self._current_ring(), self.clock(), []
        if ring is None:
            return unloaded
        on_ring = set(ring.nodes)
        for name, backend in list(self._local().items()):
            cache = backend.cache
            if cache is None or not backend.healthy or name not in on_ring:
                # a node off the ring (drained, not joined yet, prewarmed) keeps what it holds
                continue
            for model in cache.snapshot():
                if (
                    model.state != "available"
                    or model.leases
                    or model.pinned
                    or name in ring.replicas_for(model.name)
                    or self.copies.is_extra(model.name, name)
                ):
                    continue
                key = (model.name, name)
                since = self._served.setdefault(key, now)
                if now - since < self.rule.cool_s:
                    continue
                # a lease came: later
                with contextlib.suppress(errors.FailedPrecondition, errors.NotFound):
                    await cache.evict(model.name, model.version)
                    unloaded.append(key)
                    self.unloaded[name] = self.unloaded.get(name, 0) + 1
                    self._served.pop(key, None)
                    log.info(
                        "model %s version %s unloaded from %s: not one of its copies, idle %.0f s",
                        model.name,
                        model.version,
                        name,
                        now - since,
                    )
        return unloaded

    async def run(self) -> None:
        """``sweep`` every ``sweep_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await self.sweep()
            except Exception:  # a sweep must not end the loop; the next one tries again
                log.exception("copies sweep failed")


def _judged(key, backends: Mapping[str, object], local: str | None) -> dict:
    """How the router judges a request's copies: healthy ones only, and (this front end's own
    node or) those that hold the model first."""
    return {"usable": lambda n: bool(backends[n].healthy),
            "rank": lambda n: n != local and not backends[n].holds(key)}


def rule_from(copies, ring) -> CopyRule:
    """The rule from settings sections ``[copies]`` (CopiesSection) and ``[ring]`` (its minimum)."""
    return CopyRule(
        enabled=copies.enabled,
        min_copies=ring.replicas_per_model,
        max_copies=copies.max_copies,
        balance=copies.balance,
        min_load=copies.min_load,
        hot_inflight=copies.hot_inflight,
        cool_s=copies.cool_s,
        signal=copies.signal,
        rate_window_s=copies.rate_window_s,
        hot_share=copies.hot_share,
    )
