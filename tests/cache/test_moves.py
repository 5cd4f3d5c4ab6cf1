"""The live cache's demotion and promotion inputs (tfscache.cache.moves), with no node: costs from
what the cache measured, the defaults where it measured nothing, and both promotion rules."""

from __future__ import annotations

from tfscache.cache.ledger import Ledger
from tfscache.cache.moves import HOST_SLOWDOWN, PROMOTE_OF_LOAD, TierMoves
from tfscache.cache.tiers import GPU, HOST, PromoteRule


class Waiter:
    """A waiting request that gave up already: nothing to answer."""

    def done(self) -> bool:
        return True


def resident(ledger: Ledger, key, load_s: float):
    ledger.requested(key, Waiter(), 10, 10, 0.0)
    ledger.admitted(key, 0.0)
    ledger.loaded(key, load_s, 0.0)
    return ledger.entries[key]


def test_costs_come_from_what_was_measured_and_default_where_nothing_was():
    ledger = Ledger()
    moves = TierMoves(ledger, lambda key: True)
    entry = resident(ledger, ("m", 1), load_s=8.0)
    costs = moves.costs(entry)
    assert (costs.load_s, costs.promote_s) == (8.0, PROMOTE_OF_LOAD * 8.0)
    assert (costs.gpu_service_s, costs.host_service_s) == (0.0, 0.0)  # never served: no saving
    moves.released(("m", 1), GPU, 0.01)
    assert moves.costs(entry).host_service_s == 0.01 * HOST_SLOWDOWN
    moves.released(("m", 1), HOST, 0.05)
    moves.moved(("m", 1), HOST, 0.5)
    costs = moves.costs(entry)
    assert (costs.promote_s, costs.gpu_service_s, costs.host_service_s) == (0.5, 0.01, 0.05)


def test_only_idle_gpu_versions_the_node_can_move_and_whose_demotion_pays_are_demotable():
    ledger = Ledger()
    moves = TierMoves(ledger, lambda key: key[0] != "plan")
    for name, load_s in (("a", 4.0), ("plan", 4.0), ("adopted", 0.0), ("busy", 4.0)):
        resident(ledger, (name, 1), load_s)
    ledger.leased(("busy", 1), 0.0, 0.0)
    assert moves.demotable() == [("a", 1)]  # adopted: no load measured, nothing says it pays


def test_a_demoted_version_is_wanted_back_when_requests_queue_or_its_rate_pays():
    ledger = Ledger()
    moves = TierMoves(ledger, lambda key: True, PromoteRule(horizon_s=60.0, queue=3))
    queued, hot = resident(ledger, ("q", 1), 10.0), resident(ledger, ("h", 1), 10.0)
    for entry in (queued, hot):
        ledger.moving_to(entry.key, HOST)
        ledger.moved(entry.key, 1.0)
        moves.moved(entry.key, HOST, 1.0)
    # queue: the third lease in flight at once
    wanted = []
    for _ in range(3):
        ledger.leased(queued.key, 0.0, 0.0)
        wanted.append(moves.granted(queued, 0.0))
    assert wanted == [False, False, True]
    # rate: host 0.05 s against GPU 0.01 s; 1 s promotion pays at rate x 0.04 x 60 >= 1,
    # about 0.42 requests a second: one request every second gets there, the queue never
    moves.released(hot.key, GPU, 0.01)
    moves.released(hot.key, HOST, 0.05)
    for second in range(120):
        ledger.leased(hot.key, second, second)
        paid = moves.granted(hot, second)
        ledger.released(hot.key)
        if paid:
            break
    assert paid and second > 1 and moves.rates.at(hot.key, second) * 0.04 * 60 >= 1.0
    assert set(moves.promotions()) == {("q", 1), ("h", 1)}
    ledger.moving_to(("q", 1), GPU)
    ledger.moved(("q", 1), 0.8)
    moves.moved(("q", 1), GPU, 0.8)
    assert moves.promotions() == [("h", 1)]


def test_a_lease_that_saw_a_move_times_neither_tier():
    """A request served across a move waited for it: its seconds are no tier's service time (they
    would make the host tier look slow and promote what was just demoted)."""
    from tfscache.cache.lease import Leases
    from tfscache.cache.signals import Signals

    ledger = Ledger()
    moves = TierMoves(ledger, lambda key: True)
    leases = Leases(ledger, Signals(), moves=moves)
    entry = resident(ledger, ("m", 1), load_s=4.0)
    leases.grant(entry).release()
    assert set(moves.service) == {(("m", 1), GPU)}
    across = leases.grant(entry)  # granted on the GPU, released after the move to host
    ledger.moving_to(entry.key, HOST)
    during = leases.grant(entry)  # granted while it moves
    ledger.moved(entry.key, 1.0)
    across.release()
    during.release()
    assert set(moves.service) == {(("m", 1), GPU)}
    leases.grant(entry).release()
    assert set(moves.service) == {(("m", 1), GPU), (("m", 1), HOST)}
