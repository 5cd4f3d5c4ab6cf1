"""The planner with tiers (docs/tiers.md): a GPU victim taken only for GPU room is demoted to host
memory instead of unloaded when the caller says it may be; host-tier versions count no GPU bytes;
a version counts against both tiers while it moves; promotions need GPU room."""

from __future__ import annotations

from tfscache.cache.planner import Caps, plan
from tfscache.cache.tiers import GPU, HOST

from .test_planner import names, want
from .test_planner_gpu import GiB, with_gpu

GPU_CAP = Caps(max_models=10, gpu_bytes=16 * GiB)


def three_on_the_gpu():
    """a, b (6 GiB each, a the least recently used) on the GPU; c, 6 GiB, known, requested."""
    ledger, policy = with_gpu({"a": 6 * GiB, "b": 6 * GiB})
    ledger.learn_gpu(("c", 1), 6 * GiB)
    want(ledger, "c")
    return ledger, policy


def test_a_demotable_victim_of_the_gpu_cap_is_demoted_not_unloaded():
    ledger, policy = three_on_the_gpu()
    decided = plan(ledger, GPU_CAP, policy, 200.0, demotable={("a", 1), ("b", 1)})
    assert (decided.victims, names(decided.demote), names(decided.admit)) == ([], ["a"], ["c"])


def test_without_demotable_versions_the_plan_is_todays():
    ledger, policy = three_on_the_gpu()
    decided = plan(ledger, GPU_CAP, policy, 200.0)
    assert (names(decided.victims), decided.demote, names(decided.admit)) == (["a"], [], ["c"])


def test_a_victim_of_the_count_cap_is_unloaded_even_if_demotable():
    ledger, policy = three_on_the_gpu()
    decided = plan(ledger, Caps(max_models=2, gpu_bytes=16 * GiB), policy, 200.0,
                   demotable={("a", 1), ("b", 1)})
    assert (names(decided.victims), decided.demote, names(decided.admit)) == (["a"], [], ["c"])


def test_a_host_tier_version_counts_no_gpu_bytes_but_counts_host_bytes_and_the_count():
    ledger, policy = three_on_the_gpu()
    ledger.moving_to(("a", 1), HOST)
    assert ledger.gpu_used() == 12 * GiB  # it counts against both tiers while it moves
    assert ("a", 1) not in ledger.idle()  # and is no victim meanwhile
    ledger.moved(("a", 1), 0.5)
    assert (ledger.entries[("a", 1)].tier, ledger.gpu_used(), ledger.used()) == (HOST, 6 * GiB, 20)
    assert ledger.on_tier(HOST) == [("a", 1)]
    decided = plan(ledger, GPU_CAP, policy, 200.0, demotable={("b", 1)})
    assert (decided.victims, decided.demote, names(decided.admit)) == ([], [], ["c"])
    decided = plan(ledger, Caps(max_models=2, gpu_bytes=16 * GiB), policy, 200.0,
                   demotable={("b", 1)})
    assert (names(decided.victims), names(decided.admit)) == (["a"], ["c"])  # host victim: unloaded


def test_a_promotion_demotes_a_gpu_version_to_make_room():
    ledger, policy = with_gpu({"a": 8 * GiB, "b": 8 * GiB})
    ledger.moving_to(("a", 1), HOST)
    ledger.moved(("a", 1), 0.5)
    ledger.learn_gpu(("c", 1), 8 * GiB)
    want(ledger, "c")  # c fills the GPU; then a's promotion needs b's room
    decided = plan(ledger, GPU_CAP, policy, 200.0, demotable={("b", 1)}, promote=[("a", 1)])
    assert (names(decided.admit), names(decided.demote), names(decided.promote)) == (
        ["c"], ["b"], ["a"])
    assert decided.victims == []


def test_a_promotion_without_gpu_room_waits():
    ledger, policy = with_gpu({"a": 8 * GiB, "b": 8 * GiB}, leased=("b",))
    ledger.moving_to(("a", 1), HOST)
    ledger.moved(("a", 1), 0.5)
    ledger.learn_gpu(("c", 1), 8 * GiB)
    want(ledger, "c")
    decided = plan(ledger, GPU_CAP, policy, 200.0, promote=[("a", 1)])
    assert (names(decided.admit), decided.promote, decided.victims) == (["c"], [], [])


def test_a_promotion_records_its_seconds_and_a_failed_move_stays_put():
    ledger, _ = with_gpu({"a": 8 * GiB})
    ledger.moving_to(("a", 1), HOST)
    ledger.move_failed(("a", 1))
    assert (ledger.entries[("a", 1)].tier, ledger.entries[("a", 1)].moving) == (GPU, None)
    ledger.moving_to(("a", 1), HOST)
    ledger.moved(("a", 1), 0.2)
    ledger.moving_to(("a", 1), GPU)
    ledger.moved(("a", 1), 0.7)
    assert (ledger.entries[("a", 1)].tier, ledger.promoted_s) == (GPU, {("a", 1): 0.7})
