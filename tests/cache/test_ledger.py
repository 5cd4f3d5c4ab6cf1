"""The ledger's transitions, with no node: what each changes, and what the policy hears of it (once)."""

from __future__ import annotations

from tfscache import errors
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Ledger

KEY = ("m", 1)


class Waiter:
    """A request still waiting (the cache's are futures; the ledger only asks ``done()``)."""

    @staticmethod
    def done() -> bool:
        return False


class Heard:
    """An eviction policy that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_load(self, key, size, load_seconds, now) -> None:
        self.calls.append(("load", key, size, load_seconds))

    def record_access(self, key, now) -> None:
        self.calls.append(("access", key))

    def forget(self, key) -> None:
        self.calls.append(("forget", key))


def loaded_ledger(*, pinned: bool = False) -> tuple[Ledger, Heard]:
    policy = Heard()
    ledger = Ledger(policy)
    waiter = Waiter()
    assert ledger.requested(KEY, waiter, estimate=10, disk=8, now=1.0)  # a new pending load
    assert ledger.admitted(KEY, 2.0).state == LOADING
    assert ledger.loaded(KEY, 0.5, 3.0) == [waiter]  # the waiter is handed back, to get a lease
    if pinned:
        ledger.pin(KEY)
    return ledger, policy


def test_load_lease_retire_unload_tell_the_policy_once_each():
    ledger, policy = loaded_ledger()
    assert ledger.state_of(KEY) == READY
    ledger.leased(KEY, 100.0, 4.0)
    assert (ledger.entries[KEY].leases, ledger.entries[KEY].last_use) == (1, 100.0)
    ledger.released(KEY)
    ledger.retire(KEY)
    assert ledger.state_of(KEY) == UNLOADING and ledger.used() == 10  # it counts until gone
    ledger.unloaded(KEY)
    assert KEY not in ledger.entries
    assert policy.calls == [("load", KEY, 10, 0.5), ("access", KEY), ("forget", KEY)]


def test_a_lost_model_keeps_its_pin_and_an_unloaded_one_does_not():
    ledger, policy = loaded_ledger(pinned=True)
    assert ledger.lost(KEY).key == KEY
    assert KEY not in ledger.entries and KEY in ledger.pinned  # the pin survives the loss
    assert policy.calls[-1] == ("forget", KEY)
    ledger, _ = loaded_ledger(pinned=True)
    ledger.retire(KEY)
    ledger.unloaded(KEY)  # evicted on purpose (a drain): the pin goes with it
    assert KEY not in ledger.pinned


def test_a_failed_load_backs_off_and_hands_back_its_waiters():
    policy = Heard()
    ledger = Ledger(policy)
    waiter = Waiter()
    ledger.requested(KEY, waiter, 10, 8, 1.0)
    ledger.admitted(KEY, 2.0)
    other = Waiter()
    assert not ledger.requested(KEY, other)  # joins the load in flight, not a new pending one
    error = errors.NotFound("no")
    assert ledger.failed(KEY, error, until=50.0) == [waiter, other]
    assert KEY not in ledger.entries
    assert ledger.failure(KEY, 10.0) is error and ledger.failure(KEY, 60.0) is None
    assert policy.calls == []  # the policy never heard of a version that did not load


def test_a_room_wait_that_timed_out_leaves_the_queue():
    ledger = Ledger()
    ledger.requested(KEY, Waiter(), 10, 8, 1.0)
    ledger.blocked(KEY, 5.0)
    ledger.blocked(KEY, 9.0)  # still blocked: since the first time
    assert ledger.pending[KEY].blocked_since == 5.0
    assert len(ledger.gave_up(KEY).waiters) == 1
    assert not ledger.pending


def test_take_waiters_empties_every_queue():
    ledger, _ = loaded_ledger()
    queued = Waiter()
    ledger.requested(("n", 1), queued, 10, 8, 1.0)
    assert ledger.take_waiters() == [queued]
    assert not ledger.pending


def test_adopted_models_are_ready_and_reset_forgets_them():
    policy = Heard()
    ledger = Ledger(policy)
    ledger.adopted(KEY, 10, True, 100.0, 1.0, pinned=True)
    assert ledger.ready(KEY) is not None and KEY in ledger.pinned
    ledger.reset()
    assert not ledger.entries and not ledger.pinned
    assert policy.calls == [("load", KEY, 10, 0.0), ("forget", KEY)]
