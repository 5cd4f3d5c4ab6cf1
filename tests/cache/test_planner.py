"""The pure planner, with no node and no TensorFlow: every admission and eviction rule, in milliseconds."""

from __future__ import annotations

import copy

import pytest

from tfscache.cache.freeing import Freeing
from tfscache.cache.ledger import LOADING, READY, UNLOADING, Ledger
from tfscache.cache.planner import Caps, plan, waits_for_freed_memory
from tfscache.cache.policy import make_policy


class Waiting:
    """A request still waiting for its model."""

    @staticmethod
    def done() -> bool:
        return False


def ledger_with(resident: dict[str, int], *, leased=(), pinned=(), states=None) -> tuple[Ledger, object]:
    """A ledger holding ``resident`` {name: bytes} (used in that order) and an LRU policy that saw them,
    made through the ledger's own transitions (as the reloader makes them)."""
    policy = make_policy("lru")
    ledger = Ledger(policy)
    for t, (name, size) in enumerate(resident.items()):
        key, state, now = (name, 1), (states or {}).get(name, READY), float(t)
        ledger.requested(key, Waiting(), size, size, now)
        ledger.admitted(key, now)
        if state != LOADING:
            ledger.loaded(key, 1.0, now)
            ledger.accessed(key, now)
            if name in leased:
                ledger.leased(key, now, now)
            if state == UNLOADING:
                ledger.retire(key)
        if name in pinned:
            ledger.pin(key)
    return ledger, policy


def want(ledger: Ledger, name: str, size: int = 10, waiters: int = 1, first_seen: float = 100.0) -> None:
    for _ in range(waiters):
        ledger.requested((name, 1), Waiting(), size, size, first_seen)


def names(keys) -> list[str]:
    return [name for name, _ in keys]


def test_a_cold_model_loads_while_under_the_caps():
    ledger, policy = ledger_with({"a": 10})
    want(ledger, "b")
    decided = plan(ledger, Caps(max_models=2), policy, 200.0)
    assert (names(decided.admit), decided.victims, decided.blocked) == (["b"], [], [])


def test_the_least_recently_used_idle_model_makes_room():
    ledger, policy = ledger_with({"a": 10, "b": 10, "c": 10})
    policy.record_access(("a", 1), 50.0)  # a was used last: b is the least recent
    want(ledger, "d")
    decided = plan(ledger, Caps(max_models=3), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["b"], ["d"])


@pytest.mark.parametrize("held", ["leased", "pinned"])
def test_a_leased_or_pinned_model_is_never_a_victim(held):
    ledger, policy = ledger_with({"a": 10, "b": 10}, **{held: ("a",)})
    want(ledger, "c")
    decided = plan(ledger, Caps(max_models=2), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["b"], ["c"])


def test_with_every_model_held_the_load_waits_and_so_does_everything_behind_it():
    ledger, policy = ledger_with({"a": 10, "b": 10}, leased=("a",), pinned=("b",))
    want(ledger, "c", waiters=3)
    want(ledger, "d", waiters=1)
    decided = plan(ledger, Caps(max_models=2), policy, 200.0)
    assert (decided.victims, decided.admit, names(decided.blocked)) == ([], [], ["c", "d"])


def test_loads_go_in_order_of_waiting_requests_then_age():
    ledger, policy = ledger_with({})
    want(ledger, "old", waiters=1, first_seen=1.0)
    want(ledger, "busy", waiters=5, first_seen=9.0)
    want(ledger, "young", waiters=1, first_seen=5.0)
    decided = plan(ledger, Caps(max_models=2), policy, 200.0)
    assert (names(decided.admit), names(decided.blocked)) == (["busy", "old"], ["young"])


def test_the_memory_cap_counts_estimates_and_takes_as_many_victims_as_needed():
    ledger, policy = ledger_with({"a": 40, "b": 30, "c": 20})
    want(ledger, "big", size=60)
    decided = plan(ledger, Caps(memory_bytes=100), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["a", "b"], ["big"])
    assert 20 + 60 <= 100  # what is left after the plan fits


def test_models_still_loading_or_unloading_count_against_the_caps():
    ledger, policy = ledger_with({"a": 10, "b": 10, "c": 10}, states={"a": LOADING, "b": UNLOADING})
    want(ledger, "d")
    decided = plan(ledger, Caps(max_models=3), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["c"], ["d"])


def test_over_a_shrunk_cap_idle_models_go_and_over_cap_says_when_none_can():
    ledger, policy = ledger_with({"a": 10, "b": 10, "c": 10})
    decided = plan(ledger, Caps(max_models=1), policy, 200.0)
    assert (names(decided.victims), decided.over_cap) == (["a", "b"], False)
    ledger, policy = ledger_with({"a": 10, "b": 10}, leased=("a", "b"))
    decided = plan(ledger, Caps(max_models=1), policy, 200.0)
    assert (decided.victims, decided.over_cap) == ([], True)


def test_the_caps_hold_at_every_instant_of_a_plan():
    ledger, policy = ledger_with({f"m{i}": 10 + i for i in range(6)}, leased=("m2",))
    for i, name in enumerate(["x", "y", "z"]):
        want(ledger, name, size=15, waiters=3 - i)
    caps = Caps(max_models=6, memory_bytes=100)
    decided = plan(ledger, caps, policy, 200.0)
    count, used = len(ledger.entries), ledger.used()
    assert caps.fit(count, used) or decided.victims
    for victim in decided.victims:  # the victims go first (the reloader waits until they are gone) ...
        count, used = count - 1, used - ledger.entries[victim].bytes
    for key in decided.admit:  # ... then the batch loads
        count, used = count + 1, used + ledger.pending[key].estimate
        assert caps.fit(count, used), (count, used)
    assert ("m2", 1) not in decided.victims


def test_planning_changes_nothing():
    ledger, policy = ledger_with({"a": 10, "b": 10})
    want(ledger, "c")
    entries, pending = copy.copy(ledger.entries), copy.copy(ledger.pending)
    states = {k: e.state for k, e in ledger.entries.items()}
    plan(ledger, Caps(max_models=2), policy, 200.0)
    assert (ledger.entries, ledger.pending) == (entries, pending)
    assert {k: e.state for k, e in ledger.entries.items()} == states


# -- memory freed means measured free (issue 23, item 5; tfscache/cache/freeing.py) ------------------


def unloaded_but_not_freed(ledger: Ledger, name: str, *, host_before: int, until: float, gpu: int = 0,
                           gpu_before: int | None = None) -> None:
    """``name`` retired and reported gone by the node, its bytes held until measured free."""
    key = (name, 1)
    size = ledger.entries[key].bytes
    ledger.retire(key)
    ledger.unloaded(key)
    ledger.free_later(Freeing((key,), size, gpu, host_before, gpu_before, until))


def test_an_unloaded_models_bytes_count_until_the_node_measures_them_free():
    ledger, policy = ledger_with({"a": 60, "c": 30})
    unloaded_but_not_freed(ledger, "a", host_before=1000, until=50.0)
    want(ledger, "b", size=60)
    caps = Caps(memory_bytes=100)
    assert ledger.freeing_bytes() == (60, 0) and "a" not in {k[0] for k in ledger.entries}
    decided = plan(ledger, caps, policy, 10.0)  # b fits beside c: no victim taken for a's bytes
    assert (names(decided.victims), names(decided.admit)) == ([], ["b"])
    ledger.admitted(("b", 1), 10.0)
    assert waits_for_freed_memory(ledger, caps)  # 30 + 60 admitted + 60 not given back > 100: b waits
    assert ledger.freed(host_now=990, gpu_now=None, now=10.0) == ([], [])  # 10 of 60 bytes back: not yet
    assert waits_for_freed_memory(ledger, caps)
    [record], expired = ledger.freed(host_now=960, gpu_now=None, now=11.0)  # half of them back: free
    assert (record.keys, expired, ledger.freeing_bytes()) == ((("a", 1),), [], (0, 0))
    assert not waits_for_freed_memory(ledger, caps)


def test_the_bounded_wait_counts_them_free_when_the_memory_never_drops():
    ledger, policy = ledger_with({"a": 60})
    unloaded_but_not_freed(ledger, "a", host_before=1000, until=50.0)
    want(ledger, "b", size=60)
    ledger.admitted(("b", 1), 10.0)
    assert ledger.freed(host_now=1000, gpu_now=None, now=49.9) == ([], [])
    assert waits_for_freed_memory(ledger, Caps(memory_bytes=100))
    measured, [record] = ledger.freed(host_now=1000, gpu_now=None, now=50.0)
    assert (measured, record.keys, ledger.freeing_bytes()) == ([], (("a", 1),), (0, 0))
    assert not waits_for_freed_memory(ledger, Caps(memory_bytes=100))


def test_gpu_bytes_wait_for_the_gpu_to_drop_and_an_unmeasured_node_is_taken_at_its_word():
    ledger, policy = ledger_with({"a": 10, "c": 10})
    unloaded_but_not_freed(ledger, "a", host_before=1000, until=50.0, gpu=80, gpu_before=500)
    assert ledger.freeing_bytes() == (10, 80) and ledger.gpu_used() == 0
    assert ledger.freed(host_now=900, gpu_now=480, now=1.0) == ([], [])  # host back, GPU not yet
    [record], _ = ledger.freed(host_now=900, gpu_now=450, now=1.0)
    assert record.gpu == 80 and ledger.freeing_bytes() == (0, 0)
    unloaded_but_not_freed(ledger, "c", host_before=None, until=50.0)  # no pid: nothing to measure by
    assert [r.keys for r in ledger.freed(host_now=None, gpu_now=None, now=1.0)[0]] == [(("c", 1),)]
