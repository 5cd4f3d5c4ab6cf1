"""What the admin API acknowledges is on disk before the reply (issue 23, item 1).

In-process, over the module's real node: each of pin, unpin, preload, evict returns only
once the state file holds its change, a burst of pins or unpins costs one write, and a
failed write fails the acknowledgement (INTERNAL, naming the file) instead of pretending.

Five rounds of: pin (or unpin) through the admin API, SIGKILL ``tfscache serve`` as soon as
the reply is read, start it again over the same state directory, check every pin
(``sigkill_rounds``). The 50-round soak of the same rounds is scripts/soak_durable_acks.py,
its figures in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from pathlib import Path

import pytest

from admin.sigkill_rounds import sigkill_rounds
from support.node import start_node
from tfscache import errors
from tfscache.cache.manager import CacheManager
from tfscache.cache.state import load_state
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.kinds.tfserving.client import NodeClient
from tfscache.repository.local import ModelRepository
from tfscache.settings import CacheSection

ROUNDS = 5
MODELS = [f"addk_{k}" for k in range(1, 7)]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    flags = ["--max_num_load_retries=0", "--num_load_threads=2"]
    with start_node(tmp_path_factory.mktemp("durable-node"), config="model_config_list {\n}\n",
                    flags=flags) as process:
        yield process


@contextlib.asynccontextmanager
async def cache_over(node, repository: Path, state_file: Path):
    """A started CacheManager over ``node`` with ``state_file``; stopped on exit."""
    client = NodeClient(node.grpc_target, rpc_deadline_s=10.0)
    models = ModelRepository(repository)
    adapter = TFServingAdapter(client, models, rpc_deadline_s=10.0, memory=NodeMemory(node.pid))
    cache = CacheManager(adapter, models, CacheSection(), state_file=state_file)
    await cache.start()
    try:
        await cache.wait_synced(60)
        yield cache
    finally:
        await cache.stop()
        await client.close()


def pinned_on_disk(state_file: Path) -> set[str]:
    return {m.name for m in load_state(state_file).models if m.pinned}


async def test_a_burst_of_pins_is_one_write_on_disk_before_the_replies(node, admin_repo, tmp_path):
    state = tmp_path / "node.cache.json"
    async with cache_over(node, admin_repo, state) as cache:
        for model in MODELS:
            await cache.preload(model, 1)
            assert model in {m.name for m in load_state(state).models}  # preloaded: on disk at the reply
        before = cache.state_writes
        await asyncio.gather(*(cache.pin(model, 1) for model in MODELS))
        assert pinned_on_disk(state) == set(MODELS)  # read at the replies, nothing awaited in between
        assert cache.state_writes == before + 1  # six pins, one write
        before = cache.state_writes
        await asyncio.gather(*(cache.unpin(model) for model in MODELS[:3]))
        assert pinned_on_disk(state) == set(MODELS[3:])
        assert cache.state_writes == before + 1
        await cache.evict(MODELS[0])
        assert MODELS[0] not in {m.name for m in load_state(state).models}  # evicted: on disk at the reply


async def test_a_failed_state_write_fails_the_acknowledgement(node, admin_repo, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the state file's directory is a file: every write fails
    state = blocker / "node.cache.json"
    async with cache_over(node, admin_repo, state) as cache:
        with pytest.raises(errors.Internal) as caught:
            await cache.pin("addk_1", 1)
        message = caught.value.message
        assert message.startswith(f"pinned model addk_1 version 1 on node {node.grpc_target}, but the state file "
                                  f"{state} could not be written: "), message
        assert message.endswith("; a restart of this process would lose it"), message
        with pytest.raises(errors.Internal, match="^unpinned model addk_1 on node "):
            await cache.unpin("addk_1")


def test_pins_and_unpins_survive_a_sigkill_right_after_the_reply(node, admin_repo, tmp_path):
    # Two models over five rounds: pin, pin, unpin, unpin, pin; each acknowledgement followed by a
    # SIGKILL and a restart that must find it. scripts/soak_durable_acks.py runs 50 rounds (BENCHMARKS.md).
    result = sigkill_rounds(node, admin_repo, tmp_path, MODELS[:2], ROUNDS)
    assert not result.lost, f"acknowledged pins/unpins lost in {len(result.lost)} of {ROUNDS} rounds: {result.lost}"
    assert (result.pins, result.unpins) == (3, 2)
    assert result.pinned_at_end == {MODELS[0]}
    print(f"{ROUNDS} rounds, 0 lost; SIGKILL sent {statistics.median(result.kill_delays) * 1000:.3f} ms after the "
          f"reply (median; slowest {max(result.kill_delays) * 1000:.3f} ms)")
