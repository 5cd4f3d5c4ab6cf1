"""The planner's third cap: GPU bytes, learned per model from the growth across its load (tfscache.kinds.gpumem)."""

from __future__ import annotations

from tfscache.cache.planner import Caps, plan, room_message

from .test_planner import ledger_with, names, want

GiB = 1 << 30


def with_gpu(gpu: dict[str, int], **kwargs):
    """ledger_with, each model holding ``gpu`` {name: GPU bytes} (learned, as the reloader records it)."""
    ledger, policy = ledger_with({name: 10 for name in gpu}, **kwargs)
    for name, size in gpu.items():
        ledger.learn_gpu((name, 1), size)
    return ledger, policy


def test_a_learned_gpu_size_makes_room_on_the_gpu():
    ledger, policy = with_gpu({"a": 6 * GiB, "b": 6 * GiB})
    ledger.learn_gpu(("c", 1), 6 * GiB)  # c loaded before: its size is known
    want(ledger, "c")
    decided = plan(ledger, Caps(max_models=10, gpu_bytes=16 * GiB), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["a"], ["c"])  # 18 GiB > 16: the LRU one goes
    assert ledger.gpu_used() == 12 * GiB  # the plan changes nothing


def test_without_a_gpu_cap_gpu_bytes_do_not_matter():
    ledger, policy = with_gpu({"a": 60 * GiB, "b": 60 * GiB})
    ledger.learn_gpu(("c", 1), 60 * GiB)
    want(ledger, "c")
    decided = plan(ledger, Caps(max_models=10), policy, 200.0)
    assert (decided.victims, names(decided.admit)) == ([], ["c"])


def test_a_model_never_loaded_counts_no_gpu_bytes_until_measured():
    ledger, policy = with_gpu({"a": 8 * GiB, "b": 8 * GiB})  # the GPU is full
    want(ledger, "new")
    decided = plan(ledger, Caps(gpu_bytes=16 * GiB), policy, 200.0)
    assert (decided.victims, names(decided.admit)) == ([], ["new"])
    entry = ledger.admitted(("new", 1), 0.0)
    assert entry.gpu == 0
    ledger.learn_gpu(("new", 1), 4 * GiB)  # measured once loaded: 20 GiB, over the cap
    ledger.loaded(("new", 1), 1.0, 250.0)  # as the reloader records a load and its request
    ledger.accessed(("new", 1), 250.0)
    decided = plan(ledger, Caps(gpu_bytes=16 * GiB), policy, 300.0)
    assert (names(decided.victims), decided.over_cap) == (["a"], False)  # rule 1: back under the cap


def test_a_load_blocks_when_leased_models_hold_the_gpu_and_the_message_says_so():
    ledger, policy = with_gpu({"a": 8 * GiB, "b": 8 * GiB}, leased=("a", "b"))
    ledger.learn_gpu(("c", 1), 1 * GiB)
    want(ledger, "c")
    caps = Caps(gpu_bytes=16 * GiB)
    decided = plan(ledger, caps, policy, 200.0)
    assert (decided.admit, names(decided.blocked)) == ([], ["c"])
    text = room_message(ledger, caps, ledger.pending[("c", 1)], "node0", 30.0)
    assert f"gpu_bytes={16 * GiB} reached ({16 * GiB} GPU bytes in use, {GiB} more needed)" in text
    assert "memory_bytes" not in text and "max_models" not in text


def test_leaving_models_count_on_the_gpu_until_gone():
    ledger, policy = with_gpu({"a": 8 * GiB, "b": 8 * GiB}, states={"a": "unloading"})
    ledger.learn_gpu(("c", 1), 8 * GiB)
    want(ledger, "c")
    decided = plan(ledger, Caps(gpu_bytes=16 * GiB), policy, 200.0)
    assert (names(decided.victims), names(decided.admit)) == (["b"], ["c"])


def test_every_cap_must_fit():
    ledger, policy = with_gpu({"a": 1 * GiB, "b": 1 * GiB})
    ledger.learn_gpu(("c", 1), 1 * GiB)
    want(ledger, "c")
    decided = plan(ledger, Caps(max_models=2, gpu_bytes=16 * GiB), policy, 200.0)
    assert names(decided.victims) == ["a"]  # the GPU has room; the count cap does not
