"""What workers report reaches the ledger: a version with requests in flight in a worker is no
victim for capacity (``Ledger.idle``), until the count falls to 0 or the version leaves; a worker's
requests count for the policy and the entry's last use (``CacheManager.used_elsewhere``, which
``tfscache.workers.usage`` calls), each as a lease taken and given back."""

from __future__ import annotations

from tfscache.cache.lease import Leases
from tfscache.cache.ledger import Ledger
from tfscache.cache.manager import CacheManager
from tfscache.repository.local import ModelRepository
from tfscache.settings import CacheSection

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

    def set_caps(self, *caps) -> None:
        pass


class NoNode:
    """A node adapter's names only: the manager below is never started."""

    target, client, sizes_on_disk, loads_apart, lost_texts = "node0", None, True, False, ()


def ledger_with_two() -> tuple[Ledger, Heard]:
    policy = Heard()
    ledger = Ledger(policy)
    for key in (KEY, OTHER):
        ledger.adopted(key, 10, True, 100.0, 1.0, pinned=False)
    return ledger, policy


def cache_with_two(tmp_path) -> tuple[CacheManager, Heard]:
    """A CacheManager (not started) whose ledger holds KEY and OTHER, its policy recording."""
    policy = Heard()
    cache = CacheManager(NoNode(), ModelRepository(tmp_path), CacheSection(), policy=policy)
    for key in (KEY, OTHER):
        cache.ledger.adopted(key, 10, True, 100.0, 1.0, pinned=False)
    return cache, policy


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


def test_a_workers_requests_reach_the_policy_and_the_last_use(tmp_path):
    cache, policy = cache_with_two(tmp_path)
    policy.calls.clear()
    cache.used_elsewhere(*KEY, 3, 250.0)
    assert [c[:2] for c in policy.calls] == [("access", KEY)] * 3
    entry = cache.ledger.entries[KEY]
    assert entry.last_use == 250.0 and entry.leases == 0  # each lease given back
    cache.used_elsewhere("addk_9", 1, 5, 300.0)  # not resident: nothing
    cache.used_elsewhere(*OTHER, 0, 300.0)  # no requests: nothing
    assert len(policy.calls) == 3 and cache.ledger.entries[OTHER].last_use == 100.0


def test_a_workers_request_is_released_as_a_local_lease_is(tmp_path, monkeypatch):
    """``used_elsewhere`` gives each lease back through ``Leases.release``, the release a local
    lease runs (it wakes the reloader when a load or the caps wait for room), not the ledger's."""
    released = []
    release = Leases.release
    monkeypatch.setattr(Leases, "release",
                        lambda self, key: (released.append(key), release(self, key)))
    cache, _ = cache_with_two(tmp_path)
    cache.used_elsewhere(*KEY, 2, 250.0)
    assert released == [KEY]  # one lease stands for the worker's requests since its last report
    assert cache.ledger.entries[KEY].leases == 0
