"""What workers report reaches the ledger: a version with requests in flight in a worker is no
victim for capacity (``Ledger.idle``), until the count falls to 0 or the version leaves; a worker's
requests count for the policy and the entry's last use (``tfscache.workers.usage.used``)."""

from __future__ import annotations

from tfscache.cache.ledger import Ledger
from tfscache.workers.usage import used

KEY, OTHER = ("addk_1", 1), ("addk_2", 1)


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_load(self, key, *args) -> None:
        self.calls.append(("load", key))

    def record_access(self, key, now) -> None:
        self.calls.append(("access", key, now))

    def forget(self, key) -> None:
        self.calls.append(("forget", key))


def ledger_with_two() -> tuple[Ledger, Heard]:
    policy = Heard()
    ledger = Ledger(policy)
    for key in (KEY, OTHER):
        ledger.adopted(key, 10, True, 100.0, 1.0, pinned=False)
    return ledger, policy


def test_a_version_busy_in_a_worker_is_not_idle_until_its_count_falls_to_zero():
    ledger, _ = ledger_with_two()
    assert sorted(ledger.idle()) == [KEY, OTHER]
    ledger.in_flight_elsewhere(KEY, 2)
    assert ledger.idle() == [OTHER]
    ledger.in_flight_elsewhere(KEY, 0)
    assert sorted(ledger.idle()) == [KEY, OTHER]


def test_a_count_for_a_version_not_resident_or_gone_is_dropped():
    ledger, _ = ledger_with_two()
    ledger.in_flight_elsewhere(("addk_9", 1), 3)
    assert ("addk_9", 1) not in ledger.elsewhere
    ledger.in_flight_elsewhere(KEY, 1)
    ledger.retire(KEY)
    ledger.unloaded(KEY)
    ledger.in_flight_elsewhere(KEY, 0)  # the report after the unload (revoked: none in flight)
    assert KEY not in ledger.elsewhere


def test_a_workers_requests_reach_the_policy_and_the_last_use():
    ledger, policy = ledger_with_two()
    policy.calls.clear()
    used(ledger, KEY, 3, 250.0)
    assert [c[:2] for c in policy.calls] == [("access", KEY)] * 3
    assert ledger.entries[KEY].last_use == 250.0 and ledger.entries[KEY].leases == 0  # each lease given back
    used(ledger, ("addk_9", 1), 5, 300.0)  # not resident: nothing
    assert len(policy.calls) == 3
