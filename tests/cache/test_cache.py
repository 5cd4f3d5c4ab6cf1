"""CacheManager against a real ``tfscache node``: loads, leases, eviction, concurrency, hazards.

Slow and failing loads are held on the node's load gate, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import grpc
import pytest

from tfscache import errors
from tfscache.cache.policy import POLICIES
from tfscache.wire import serving_pb2 as pb

from support.cache import MODEL_BYTES
from support.waiting import until


async def not_done_within(awaitable_task: asyncio.Task, seconds: float = 0.3) -> None:
    """Assert "nothing happened": the task is still pending after a short wait."""
    done, _ = await asyncio.wait({awaitable_task}, timeout=seconds)
    assert not done, f"{awaitable_task} finished early: {awaitable_task.result() if not awaitable_task.exception() else awaitable_task.exception()!r}"


async def _is_end(anode, name) -> bool:
    return await anode.state(name) == "END"


def resident(cache) -> dict[str, str]:
    return {m.name: m.state for m in cache.snapshot()}


async def test_cold_load_then_hit(make_cache, anode):
    cache = await make_cache(max_models_per_node=3)
    assert cache.healthy
    lease = await cache.acquire("addk_1")
    assert (lease.name, lease.version) == ("addk_1", 1)
    assert await anode.state("addk_1") == "AVAILABLE"
    assert await anode.add("addk_1", 1, 10.0) == 11.0
    assert cache.is_resident("addk_1") and cache.is_resident("addk_1", 1)
    assert not cache.is_resident("addk_2") and not cache.is_resident("../x")
    [model] = cache.snapshot()
    assert (model.name, model.version, model.leases, model.state) == ("addk_1", 1, 1, "available")
    assert model.measured and model.bytes >= MODEL_BYTES  # RSS growth, never below the size on disk
    lease.release()
    lease.release()  # idempotent
    reloads = len(cache.node.reloads)
    async with await cache.acquire("addk_1", 1) as again:
        assert cache.snapshot()[0].leases == 1
    assert again.version == 1 and cache.snapshot()[0].leases == 0
    assert len(cache.node.reloads) == reloads  # a hit sends nothing
    # The config sent: platform tensorflow, a specific version, base path in the repository.
    assert cache.node.reloads[-1] == {"addk_1": (1,)}


async def test_config_entries_are_specific_and_inside_the_repository(make_cache, repository):
    cache = await make_cache()
    async with await cache.acquire("addk_2"):
        config = cache.adapter.config(cache.wanted())
    [model] = config.model_config_list.config
    assert model.name == "addk_2" and model.model_platform == "tensorflow"
    assert model.base_path == str(repository.root / "addk_2")
    assert list(model.model_version_policy.specific.versions) == [1]


@pytest.mark.parametrize("name, version, code, text", [
    ("nope", None, grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)"),
    ("addk_1", 7, grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(addk_1, 7)"),
    ("..", None, grpc.StatusCode.INVALID_ARGUMENT,
     "Invalid model name '..': a model name must not be '.' or '..'"),
    ("a/b", None, grpc.StatusCode.INVALID_ARGUMENT,
     "Invalid model name 'a/b': a model name must be one path segment (no '/' or NUL)"),
    ("", None, grpc.StatusCode.INVALID_ARGUMENT, "Invalid model name '': a model name must not be empty"),
    ("a\0", None, grpc.StatusCode.INVALID_ARGUMENT,
     "Invalid model name 'a\\x00': a model name must be one path segment (no '/' or NUL)"),
    ("n" * 256, 1, grpc.StatusCode.INVALID_ARGUMENT,
     f"Invalid model name '{'n' * 200}...': a model name must be at most 255 bytes, got 256"),
])
async def test_bad_names(make_cache, name, version, code, text):
    cache = await make_cache()
    with pytest.raises(errors.TfscacheError) as info:
        await cache.acquire(name, version)
    assert (info.value.grpc_code, info.value.message) == (code, text)
    assert cache.node.reloads == [{}]  # nothing but the clearing reload at start


async def test_concurrent_acquires_share_one_load(make_cache, gate, node):
    cache = await make_cache()
    loaded_before = node.log_text().count("loaded addk_3 version 1 ")  # the node is the session's
    gate.hold("addk_3")
    tasks = [asyncio.create_task(cache.acquire("addk_3")) for _ in range(8)]
    await gate.wait_until_waiting("addk_3")
    await not_done_within(tasks[0], 0.1)
    gate.release("addk_3")
    leases = await asyncio.gather(*tasks)
    assert {(lease.name, lease.version) for lease in leases} == {("addk_3", 1)}
    assert cache.snapshot()[0].leases == 8
    assert cache.node.loads_of("addk_3") == 1
    assert node.log_text().count("loaded addk_3 version 1 ") == loaded_before + 1
    for lease in leases:
        lease.release()
    assert cache.snapshot()[0].leases == 0


async def test_cold_models_arriving_during_a_reload_share_the_next(make_cache, gate):
    cache = await make_cache()
    gate.hold("addk_1")
    first = asyncio.create_task(cache.acquire("addk_1"))
    await gate.wait_until_waiting("addk_1")
    later = [asyncio.create_task(cache.acquire(f"addk_{k}")) for k in (2, 3, 4) for _ in range(2)]
    await until(lambda: sum(q.waiters for q in cache.queue()) == 6, 30, "six requests waiting")
    await not_done_within(later[0], 0.1)
    assert len(cache.node.reloads) == 2  # the clearing one, and the one loading addk_1
    gate.release("addk_1")
    for lease in await asyncio.gather(first, *later):
        lease.release()
    assert cache.node.reloads[2:] == [{f"addk_{k}": (1,) for k in (1, 2, 3, 4)}]


async def test_a_hit_never_waits_behind_a_load(make_cache, gate):
    cache = await make_cache()
    (await cache.acquire("addk_1")).release()
    gate.hold("addk_2")
    cold = asyncio.create_task(cache.acquire("addk_2"))
    await gate.wait_until_waiting("addk_2")
    hit = await asyncio.wait_for(cache.acquire("addk_1"), 1.0)  # completes while addk_2 is held
    assert not cold.done()
    hit.release()
    gate.release("addk_2")
    (await cold).release()


async def test_lru_order_and_caps(make_cache, anode):
    cache = await make_cache(max_models_per_node=3)
    for k in (1, 2, 3):
        (await cache.acquire(f"addk_{k}")).release()
    (await cache.acquire("addk_1")).release()  # addk_2 is now least recently used
    (await cache.acquire("addk_4")).release()
    assert sorted(resident(cache)) == ["addk_1", "addk_3", "addk_4"]
    assert await anode.state("addk_2") == "END"
    # The victim left the config, reached END, and only then was addk_4 added.
    assert cache.node.reloads[-2:] == [{"addk_1": (1,), "addk_3": (1,)},
                                      {"addk_1": (1,), "addk_3": (1,), "addk_4": (1,)}]
    (await cache.acquire("addk_5")).release()
    assert sorted(resident(cache)) == ["addk_1", "addk_4", "addk_5"]
    assert await anode.available([f"addk_{k}" for k in range(1, 6)]) == {"addk_1", "addk_4", "addk_5"}


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_leased_model_is_never_evicted_and_load_waits_for_room(make_cache, anode, policy):
    cache = await make_cache(max_models_per_node=2, policy=policy)
    held1 = await cache.acquire("addk_1")
    held2 = await cache.acquire("addk_2")
    waiting = asyncio.create_task(cache.acquire("addk_3"))
    await until(lambda: any(q.waiting_for_room for q in cache.queue()), 30,
                "a load waiting for room")
    await not_done_within(waiting, 0.3)
    assert await anode.available(["addk_1", "addk_2", "addk_3"]) == {"addk_1", "addk_2"}
    held2.release()  # now addk_2 is idle: it makes room
    lease3 = await waiting
    assert sorted(resident(cache)) == ["addk_1", "addk_3"]
    assert await anode.state("addk_2") == "END" and await anode.add("addk_1", 1, 1.0) == 2.0
    held1.release()
    lease3.release()


async def test_waiting_for_room_times_out_with_resource_exhausted(make_cache):
    cache = await make_cache(max_models_per_node=2, room_timeout_s=0.3)
    held = [await cache.acquire("addk_1"), await cache.acquire("addk_2"), await cache.acquire("addk_2")]
    results = await asyncio.gather(cache.acquire("addk_3"), cache.acquire("addk_3"), return_exceptions=True)
    for result in results:
        assert isinstance(result, errors.CapacityExhausted)
        assert result.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        sizes = {m.name: m.bytes for m in cache.snapshot()}
        assert result.message == (
            f"No room on node {cache.node.target} to load model addk_3 version 1 within 0.3 s: "
            f"max_models=2 reached; held by addk_1 version 1 (1 lease, {sizes['addk_1']} bytes), "
            f"addk_2 version 1 (2 leases, {sizes['addk_2']} bytes)")
    assert cache.queue() == []
    for lease in held:
        lease.release()
    (await cache.acquire("addk_3")).release()  # room again


async def test_memory_cap_counts_bytes_and_refuses_a_model_larger_than_the_cap(make_cache, repository):
    disk = repository.disk_bytes("addk_1", 1)
    cache = await make_cache(memory_per_node=int(disk * 1.2) - 1)
    with pytest.raises(errors.CapacityExhausted) as info:
        await cache.acquire("addk_1")
    assert info.value.message == (
        f"model addk_1 version 1 needs {int(disk * 1.2)} bytes (1.2 x its size on disk), "
        f"more than memory_bytes={int(disk * 1.2) - 1} of node {cache.node.target}")
    assert cache.node.reloads == [{}]


async def test_failed_load_reaches_every_waiter_leaves_the_config_and_backs_off(make_cache, gate, anode):
    cache = await make_cache(failure_backoff_s=2.0)
    gate.fail("addk_5")
    gate.hold("addk_5")
    tasks = [asyncio.create_task(cache.acquire("addk_5")) for _ in range(3)]
    await gate.wait_until_waiting("addk_5")
    gate.release("addk_5")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failed_at = time.monotonic()
    for result in results:
        assert isinstance(result, errors.Internal)
        assert result.message == "injected load failure for addk_5"
    assert await anode.state("addk_5") == "END"
    assert (await anode.states("addk_5"))[1][1:] == (13, "injected load failure for addk_5")
    assert cache.node.reloads[-1] == {}  # removed again: a failed version would stay sticky
    sent = len(cache.node.reloads)
    with pytest.raises(errors.Internal, match="^injected load failure for addk_5$"):
        await cache.acquire("addk_5")  # within the back-off: the same error, no reload
    assert len(cache.node.reloads) == sent
    gate.unfail("addk_5")
    assert time.monotonic() - failed_at < 2.0  # the check above ran within the back-off
    await asyncio.sleep(failed_at + 2.0 - time.monotonic())  # the back-off (the thing under test) passes
    async with await cache.acquire("addk_5"):
        assert await anode.add("addk_5", 1, 1.0) == 6.0


async def test_removed_then_readded_model_is_confirmed_by_status(make_cache, anode):
    cache = await make_cache(max_models_per_node=1)
    for name in ["addk_1", "addk_2", "addk_1", "addk_2", "addk_1"]:
        async with await cache.acquire(name):
            assert await anode.add(name, 1, 0.0) == float(name.split("_")[1])
    assert resident(cache) == {"addk_1": "available"}


async def test_vanished_directory_is_dropped_before_it_can_wedge_the_node(make_cache, repo_root, anode):
    cache = await make_cache()
    (await cache.acquire("addk_6")).release()
    (await cache.acquire("addk_7")).release()
    moved = repo_root.parent / "addk_6.moved"
    shutil.move(repo_root / "addk_6", moved)
    try:
        # Sending addk_6's missing base path would block this reload on the node forever.
        async with await asyncio.wait_for(cache.acquire("addk_8"), 30):
            assert await anode.add("addk_8", 1, 1.0) == 9.0
        assert all("addk_6" not in config for config in cache.node.reloads[-2:])
        assert sorted(resident(cache)) == ["addk_7", "addk_8"]
        assert await anode.state("addk_6") == "END"
        with pytest.raises(errors.ModelNotFound, match=r"^Servable not found for request: Latest\(addk_6\)$"):
            await cache.acquire("addk_6")
        with pytest.raises(errors.ModelNotFound, match=r"^Servable not found for request: Specific\(addk_6, 1\)$"):
            await cache.acquire("addk_6", 1)
    finally:
        shutil.move(moved, repo_root / "addk_6")
    (await cache.acquire("addk_6")).release()


async def test_priority_most_waiters_first_then_oldest(make_cache):
    cache = await make_cache(max_models_per_node=1)
    busy = await cache.acquire("addk_1")
    order = []

    async def client(name):
        lease = await cache.acquire(name)
        order.append(name)
        lease.release()

    tasks = [asyncio.create_task(client("addk_2"))]
    await until(lambda: len(cache.queue()) == 1, 30, "one load queued")
    tasks += [asyncio.create_task(client("addk_3")) for _ in range(3)]
    await until(lambda: len(cache.queue()) == 2, 30, "two loads queued")
    tasks += [asyncio.create_task(client("addk_4")) for _ in range(3)]
    await until(lambda: sum(q.waiters for q in cache.queue()) == 7, 30, "seven requests waiting")
    busy.release()
    await asyncio.gather(*tasks)
    assert order == ["addk_3"] * 3 + ["addk_4"] * 3 + ["addk_2"]
    reloads = cache.node.reloads
    added = [name for before, after in zip(reloads, reloads[1:]) for name in sorted(set(after) - set(before))]
    assert added == ["addk_1", "addk_3", "addk_4", "addk_2"]


async def test_acquire_timeout_is_deadline_exceeded_and_the_load_goes_on(make_cache, gate):
    cache = await make_cache()
    gate.hold("addk_9")
    with pytest.raises(errors.DeadlineExceeded) as info:
        await cache.acquire("addk_9", timeout=0.2)
    assert info.value.message == (f"Timed out after 0.2 s waiting for model addk_9 version 1 "
                                  f"to load on node {cache.node.target}")
    gate.release("addk_9")
    await until(lambda: cache.is_resident("addk_9"), 30, "addk_9 to load")
    assert cache.snapshot()[0].leases == 0  # the late lease went nowhere


async def test_reload_past_its_deadline_marks_the_node_unhealthy_then_recovers(make_cache, gate):
    cache = await make_cache(health_retry_s=0.1)
    (await cache.acquire("addk_1")).release()
    cache.settings.reload_deadline_s = 0.5  # only for the held load: a busy machine may need more
    gate.hold("addk_10")
    with pytest.raises(errors.NodeUnavailable) as info:
        await cache.acquire("addk_10")
    assert info.value.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert info.value.message.startswith(f"node {cache.node.target} is unhealthy: reload loading addk_10:1: ")
    assert not cache.healthy
    hit = await cache.acquire("addk_1")  # resident models still serve
    hit.release()
    with pytest.raises(errors.NodeUnavailable, match="is unhealthy"):
        await cache.acquire("addk_2")  # no new loads meanwhile
    cache.settings.reload_deadline_s = 60.0
    gate.release("addk_10")
    await until(lambda: cache.healthy, 30, "recovery")
    (await cache.acquire("addk_2")).release()
    assert sorted(resident(cache)) == ["addk_1", "addk_2"]  # addk_10's outcome was unknown: dropped


async def test_restart_readopts_what_the_node_still_serves(make_cache, tmp_path, anode):
    state = tmp_path / "node.cache.json"
    first = await make_cache(state_file=state, max_models_per_node=3)
    (await first.acquire("addk_1")).release()
    (await first.acquire("addk_2")).release()
    (await first.acquire("addk_1")).release()
    learned = {m.name: m.bytes for m in first.snapshot()}
    await first.stop()
    # Meanwhile someone else loads addk_3 on the node: a model the manager does not know.
    await first.node.reload(pb.ModelServerConfig(model_config_list={"config": [
        {"name": n, "base_path": str(first.repository.base_path(n)), "model_platform": "tensorflow",
         "model_version_policy": {"specific": {"versions": [1]}}} for n in ("addk_1", "addk_2", "addk_3")]}))
    assert await anode.available(["addk_1", "addk_2", "addk_3"]) == {"addk_1", "addk_2", "addk_3"}

    second = await make_cache(state_file=state, max_models_per_node=3)
    assert {m.name: m.bytes for m in second.snapshot()} == learned
    assert second.node.reloads == [{"addk_1": (1,), "addk_2": (1,)}]
    async with await second.acquire("addk_1"):
        pass
    assert len(second.node.reloads) == 1  # a hit: adopted, not reloaded
    (await second.acquire("addk_4")).release()
    (await second.acquire("addk_5")).release()  # evicts addk_2: LRU order survived the restart
    assert sorted(resident(second)) == ["addk_1", "addk_4", "addk_5"]
    await until(lambda: _is_end(anode, "addk_3"), 30, "addk_3 to unload")


async def test_restart_without_state_clears_the_node(make_cache, anode):
    first = await make_cache()
    (await first.acquire("addk_1")).release()
    await first.stop()
    second = await make_cache()
    assert second.snapshot() == [] and second.node.reloads == [{}]
    await until(lambda: _is_end(anode, "addk_1"), 30, "addk_1 to unload")


async def test_stop_fails_waiters_with_unavailable(make_cache, gate):
    cache = await make_cache()
    gate.hold("addk_11")
    task = asyncio.create_task(cache.acquire("addk_11"))
    await gate.wait_until_waiting("addk_11")
    await cache.stop()
    with pytest.raises(errors.NodeUnavailable, match=r"^cache manager for node .* stopped$"):
        await task
    with pytest.raises(errors.NodeUnavailable, match=r"^node .* is unhealthy: its cache manager stopped$"):
        await cache.acquire("addk_12")
    gate.release("addk_11")


async def test_reload_error_is_not_trusted_over_get_model_status(make_cache, anode):
    """Real TF Serving can answer a re-add with UNKNOWN "did not become available" and load
    the model moments later (docs/upstream/tfserving.md, "Hazards that follow from the
    ordering"); `tfscache node` does not
    reproduce that timing, so the client reports the real server's error after the reload."""
    cache = await make_cache()
    real_reload = cache.node.reload

    async def reload_then_report_the_stale_end(config, deadline_s=None):
        await real_reload(config, deadline_s)
        if "addk_4" in {m.name for m in config.model_config_list.config}:
            raise errors.Unknown("1 model(s) did not become available: {{{name: addk_4 version: 1}}, }")

    cache.node.reload = reload_then_report_the_stale_end
    async with await cache.acquire("addk_4"):
        assert await anode.add("addk_4", 1, 1.0) == 5.0
    assert resident(cache) == {"addk_4": "available"}


async def test_second_version_of_a_resident_model(make_cache, synthetic_models, repo_root, anode):
    [base] = synthetic_models([30], versions=(1, 2))
    shutil.copytree(base, repo_root / "addk_30", dirs_exist_ok=True)
    cache = await make_cache()
    old = await cache.acquire("addk_30", 1)
    # The node applies a version-policy change at its next poll without waiting; the
    # manager confirms version 2 with GetModelStatus.
    async with await cache.acquire("addk_30") as new:
        assert new.version == 2
        assert cache.adapter.config(cache.wanted()).model_config_list.config[0].model_version_policy.specific.versions == [1, 2]
        assert await anode.state("addk_30", 1) == "AVAILABLE" and await anode.state("addk_30", 2) == "AVAILABLE"
    old.release()
    assert sorted((m.name, m.version) for m in cache.snapshot()) == [("addk_30", 1), ("addk_30", 2)]


async def test_restart_adopts_only_what_the_node_still_serves(make_cache, tmp_path, anode):
    state = tmp_path / "node.cache.json"
    first = await make_cache(state_file=state)
    for name in ("addk_1", "addk_2"):
        (await first.acquire(name)).release()
    await first.stop()
    saved = json.loads(state.read_text())
    assert saved["node"] == first.node.target
    assert sorted((m["name"], m["version"], m["measured"]) for m in saved["models"]) == [
        ("addk_1", 1, True), ("addk_2", 1, True)]
    # The node lost addk_2 meanwhile (say, someone else reloaded it away).
    only_1 = pb.ModelServerConfig()
    only_1.model_config_list.config.add(name="addk_1", base_path=str(first.repository.base_path("addk_1")),
                                        model_platform="tensorflow").model_version_policy.specific.versions.append(1)
    await first.node.reload(only_1)
    await until(lambda: _is_end(anode, "addk_2"), 30, "addk_2 to unload")
    second = await make_cache(state_file=state)
    assert [(m.name, m.state) for m in second.snapshot()] == [("addk_1", "available")]
    assert second.node.reloads == [{"addk_1": (1,)}]


async def test_pins_survive_a_restart(make_cache, tmp_path, anode):
    state = tmp_path / "node.cache.json"
    first = await make_cache(state_file=state, max_models_per_node=2)
    await first.pin("addk_1")
    await first.pin("addk_2")
    await first.unpin("addk_2")
    await first.stop()
    assert {m["name"]: m["pinned"] for m in json.loads(state.read_text())["models"]} == {
        "addk_1": True, "addk_2": False}
    second = await make_cache(state_file=state, max_models_per_node=2)
    assert {(m.name, m.pinned) for m in second.snapshot()} == {("addk_1", True), ("addk_2", False)}
    for name in ("addk_3", "addk_4"):  # room comes from addk_2 and then addk_3, never the pinned addk_1
        (await second.acquire(name)).release()
    assert sorted(resident(second)) == ["addk_1", "addk_4"]
    await second.stop()

    # The node lost the pinned model meanwhile (restarted empty): the next start loads and pins it again.
    await second.node.reload(pb.ModelServerConfig(model_config_list={"config": []}))
    await until(lambda: _is_end(anode, "addk_1"), 30, "addk_1 to unload")
    third = await make_cache(state_file=state, max_models_per_node=2)
    await until(lambda: [(m.name, m.state, m.pinned) for m in third.snapshot()] == [
        ("addk_1", "available", True)], 30, "addk_1 to be loaded and pinned again")
    assert await anode.add("addk_1", 1, 1.0) == 2.0


class ScriptedMemory:
    """The node's RSS as the cache reads it around each load, from a script (then unmeasured)."""

    pid = None

    def __init__(self, readings: list[int]) -> None:
        self.readings = readings

    def rss(self) -> int | None:
        return self.readings.pop(0) if self.readings else None

    def replaced(self) -> bool:
        return False


async def test_over_the_memory_cap_after_a_load_it_evicts_once_a_lease_ends(make_cache, repository):
    # A load measured far above its estimate puts the accounting over the cap while every model is
    # leased; nothing can go then. When a lease ends the idle model must go, with nothing pending
    # (the race test's rare end state: over the cap until the next request came).
    disk = repository.disk_bytes("addk_1", 1)
    # addk_1 grows RSS by its size, addk_2 by 3x
    cache = await make_cache(memory_per_node=int(disk * 1.2 * 3), memory=ScriptedMemory([0, disk, 0, 3 * disk]))
    first = await cache.acquire("addk_1")
    second = await cache.acquire("addk_2")
    sizes = {m.name: m.bytes for m in cache.snapshot()}
    assert sizes == {"addk_1": disk, "addk_2": 3 * disk} and sum(sizes.values()) > cache.settings.memory_per_node
    first.release()
    await until(lambda: resident(cache) == {"addk_2": "available"}, 30, "addk_1 to be evicted")
    second.release()
