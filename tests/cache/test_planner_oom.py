"""Out of memory on a node, in the pure planner and the ledger: a load retried after the node ran
out of memory takes idle victims caps or not (planner rule 3), a request's room is taken in the
policy's order, and the RESOURCE_EXHAUSTED text names caps and holders, never the node's own.
The same against a real Triton node: tests/triton/test_triton_oom.py."""

from __future__ import annotations

from cache.test_planner import Waiting, ledger_with, names, want

from tfscache import errors
from tfscache.cache.planner import OOM_GROWTH, Caps, grown, oom_message, plan, room_victims


def test_node_texts_of_out_of_memory_are_recognised():
    for text in (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)",
        "OOM when allocating tensor with shape[1024,1024] and type float on /job:localhost",
        "onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer",
        "CUDA error: CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "MemoryError: ",
        "Failed to increase the shared memory pool size for key 'triton_python_backend_shm'",
    ):
        assert errors.is_out_of_memory(text), text
    for text in ("Servable not found for request", "No room on node node0 to load model a",
                 "model a version 1 is not in the model repository"):
        assert not errors.is_out_of_memory(text), text


def test_a_retried_load_takes_idle_victims_though_the_caps_fit():
    ledger, policy = ledger_with({"a": 10, "b": 10, "c": 10})
    want(ledger, "x", size=10)
    assert plan(ledger, Caps(max_models=8), policy, 200.0).victims == []  # room enough, by caps
    ledger.admitted(("x", 1), 200.0)
    pending = ledger.retry_load(("x", 1), grown(15), 201.0)  # its load ran the node out
    assert pending.room == grown(15) == int(15 * OOM_GROWTH) + 1 and ledger.learned[("x", 1)] == 23
    decided = plan(ledger, Caps(max_models=8), policy, 202.0)
    assert names(decided.victims) == ["a", "b", "c"]  # 23 bytes of room: three of 10, oldest first
    assert names(decided.admit) == ["x"]
    ledger.admitted(("x", 1), 202.0)
    assert ledger.entries[("x", 1)].retried  # a second shortage is then RESOURCE_EXHAUSTED


def test_a_retried_load_keeps_its_waiters():
    ledger, _ = ledger_with({})
    waiter = Waiting()
    ledger.requested(("x", 1), waiter, 5, 5, 0.0)
    ledger.admitted(("x", 1), 0.0)
    pending = ledger.retry_load(("x", 1), 9, 1.0)
    assert pending.waiters == [waiter] and ("x", 1) not in ledger.entries


def test_room_for_a_request_is_idle_models_in_policy_order_never_leased_pinned_or_itself():
    ledger, policy = ledger_with({"a": 10, "b": 30, "c": 10, "d": 10, "x": 10},
                                 leased=("b",), pinned=("c",))
    assert names(room_victims(ledger, policy, ("x", 1), 15, 10.0)) == ["a", "d"]
    assert names(room_victims(ledger, policy, ("x", 1), 0, 10.0)) == ["a"]  # at least one
    lone, lone_policy = ledger_with({"x": 10})
    assert room_victims(lone, lone_policy, ("x", 1), 15, 10.0) == []


def test_a_grown_version_counts_its_new_size_at_once():
    ledger, _ = ledger_with({"a": 10})
    ledger.grew(("a", 1), 16)
    assert ledger.entries[("a", 1)].bytes == 16 and ledger.learned[("a", 1)] == 16


def test_the_text_names_caps_and_holders_not_the_node():
    ledger, _ = ledger_with({"a": 10, "b": 20}, leased=("b",))
    text = oom_message(ledger, Caps(max_models=4, gpu_bytes=100), ("b", 1), "node0", "running",
                       [("a", 1)])
    assert text == ("Out of memory on node node0 running model b version 1: it ran out again "
                    "after unloading a version 1; caps: max_models=4, gpu_bytes=100; held by "
                    "a version 1 (0 leases, 10 bytes), b version 1 (1 lease, 20 bytes)")
    assert "with no idle model to unload; caps: none set" in oom_message(
        ledger, Caps(), ("b", 1), "node0", "running", [])
