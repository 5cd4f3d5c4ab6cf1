"""Memory freed means measured free (issue 23, item 5; tfscache/cache/freeing.py).

Over the module's real ``tfscache node``, with the node's memory as the cache reads it set
by the test (``HeldMemory``): an unload the node has reported done leaves the model's bytes
counted under the memory cap until the measured memory drops; a load admitted on that room
is not sent to the node meanwhile, and is sent once it drops, or once ``cache.free_wait_s``
has passed.
"""

from __future__ import annotations

import asyncio

import pytest

from support.cache import NODE_FLAGS
from support.node import start_node
from support.waiting import until

BASE = 1_000_000_000  # the node's memory before any model, as HeldMemory reports it


@pytest.fixture(scope="module")
def node(tmp_path_factory, gate):
    """This module's own node (not the session's of conftest.py): a test here asserts that a load
    never reached the node by its state NONE, which a node that once held the model reports as END."""
    with start_node(tmp_path_factory.mktemp("freed-node"), config="model_config_list {}\n",
                    flags=[*NODE_FLAGS, f"--load_gate_dir={gate.dir}"]) as process:
        yield process


class HeldMemory:
    """The node's RSS as the cache reads it: whatever the test last set."""

    pid = None

    def __init__(self, value: int) -> None:
        self.value = value

    def rss(self) -> int | None:
        return self.value

    def replaced(self) -> bool:
        return False


async def still_waiting(task: asyncio.Task, within: float = 0.5) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(task), within)
    except TimeoutError:
        return True
    return False


async def evict_for_the_next(make_cache, repository, anode, **settings):
    """addk_1 loaded (grown by its size on disk), then idle; addk_2 requested, which needs its room.
    Returns (cache, memory, the task acquiring addk_2) once the node has unloaded addk_1."""
    disk = repository.disk_bytes("addk_1", 1)
    memory = HeldMemory(BASE)
    cache = await make_cache(memory_per_node=int(disk * 1.5), memory=memory, **settings)
    load = asyncio.ensure_future(cache.acquire("addk_1"))
    await until(lambda: cache.state_of("addk_1", 1) == "loading", 30, "addk_1 to load",
                interval=0.005)  # a state it leaves soon
    memory.value = BASE + disk  # what the load took
    (await load).release()
    assert {m.name: m.bytes for m in cache.snapshot()} == {"addk_1": disk}
    second = asyncio.ensure_future(cache.acquire("addk_2"))
    await until(lambda: cache.state_of("addk_1", 1) is None, 30, "addk_1 to be unloaded")
    assert await anode.state("addk_1") == "END"  # the node says it is gone
    return cache, memory, second, disk


async def test_a_load_waits_until_the_unloaded_models_memory_is_measured_free(make_cache, repository, anode):
    cache, memory, second, disk = await evict_for_the_next(make_cache, repository, anode)
    assert await still_waiting(second)  # the memory did not drop: addk_1's bytes still count
    # Admitted on addk_1's room, held back from the node until that room is measured free.
    assert cache.state_of("addk_2", 1) == "loading" and await anode.state("addk_2") == "NONE"
    assert await still_waiting(second)
    memory.value = BASE  # the node gives it back
    (await asyncio.wait_for(second, 60)).release()
    assert cache.state_of("addk_2", 1) == "available"


async def test_a_node_that_never_gives_memory_back_blocks_loads_for_free_wait_s_only(make_cache, repository, anode):
    cache, memory, second, disk = await evict_for_the_next(make_cache, repository, anode, free_wait_s=1.0)
    (await asyncio.wait_for(second, 60)).release()  # after the bounded wait, though memory.value never dropped
    assert memory.value == BASE + disk and cache.state_of("addk_2", 1) == "available"
