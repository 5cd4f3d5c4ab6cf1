"""Spread's sweep against a cache stand-in (the real cache and nodes: tests/frontend/test_copies.py).

The stand-in (tests/support/fakecache.py) answers what the sweep calls of ``CacheManager``
(``snapshot`` and ``evict``, which refuses a leased or pinned model with FailedPrecondition, as
the real one does).
"""

from __future__ import annotations

from dataclasses import dataclass

from support.fakecache import FakeCache, resident
from tfscache.cluster.copies import CopyRule
from tfscache.cluster.ring import Ring
from tfscache.cluster.spread import Spread
from tfscache.frontend.methods import RouteKey


@dataclass
class FakeNode:
    name: str
    cache: FakeCache
    healthy: bool = True

    def holds(self, key) -> bool:
        return any(m.name == key.name for m in self.cache.models)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def owned_by(ring: Ring, node: str, count: int) -> list[str]:
    return [m for m in (f"m{i}" for i in range(200)) if ring.owner(m) == node][:count]


async def test_the_sweep_unloads_idle_non_copies_on_ring_nodes_only():
    ring = Ring(["a", "b"])
    home_a = owned_by(ring, "a", 4)  # resident on b: none of b's copies
    clock = Clock()
    spread = Spread(CopyRule(cool_s=60), clock=clock)
    b = FakeNode("b", FakeCache([resident(home_a[0]), resident(home_a[1], leases=1),
                                 resident(home_a[2], pinned=True), resident(owned_by(ring, "b", 1)[0])]))
    c = FakeNode("c", FakeCache([resident(home_a[3])]))  # a local node off the ring (not joined)
    spread.watch(lambda: {"b": b, "c": c})
    spread.candidates(RouteKey(home_a[0], None), ring, {"a": FakeNode("a", FakeCache([])), "b": b})
    assert await spread.sweep() == []  # first seen now: idle for 0 s
    clock.now = 59.0
    assert await spread.sweep() == []
    clock.now = 61.0
    assert await spread.sweep() == [(home_a[0], "b")]  # the leased, the pinned and b's own model stay
    assert b.cache.evicted == [home_a[0]] and c.cache.evicted == []
    assert spread.unloaded == {"b": 1}


async def test_a_front_end_that_never_routed_still_sweeps_on_the_ring_it_watches():
    """A sidecar whose node serves only forwarded requests (its peers route, it never does) still
    unloads the extra copy a peer added on its node, once idle for cool_s: the sweep reads the
    ring it watches (the topology's), not the ring of the last request routed here (issue 31)."""
    ring = Ring(["a", "b"])
    extra = owned_by(ring, "a", 1)[0]  # an extra copy on b, added by a's front end
    clock = Clock()
    b = FakeNode("b", FakeCache([resident(extra), resident(owned_by(ring, "b", 1)[0])]))
    blind = Spread(CopyRule(cool_s=60), clock=clock)
    blind.watch(lambda: {"b": b})  # no ring: it knows only a ring a request showed it
    watching = Spread(CopyRule(cool_s=60), clock=clock)
    watching.watch(lambda: {"b": b}, lambda: ring)
    for spread in (blind, watching):
        with spread.serving(extra, "b"):  # a forwarded request served by b's node
            pass
    clock.now = 61.0
    assert await blind.sweep() == [] and b.cache.evicted == []
    assert await watching.sweep() == [(extra, "b")] and b.cache.evicted == [extra]
    assert watching.unloaded == {"b": 1}
