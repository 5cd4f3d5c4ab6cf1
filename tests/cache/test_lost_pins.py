"""A pinned model the node lost keeps its pin and is loaded again, whichever path finds the loss
(issue 19): ``recover`` (the cache had turned unhealthy: the node was down) and ``resync`` (the
cache was healthy; a request's NOT_FOUND made it ``recheck``). Both come to ``Recovery.lost`` and
``Ledger.lost`` (docs/state.md, "Pins"), and the cache manager loads and pins it again.

Each test runs its own ``tfscache node``, pins a model through a CacheManager, SIGKILLs the
node and starts it again on the same ports with an empty config. The gate (``--load_gate_dir``)
makes the loss certain: the node's first load of the pinned model after its restart fails.
"""

from __future__ import annotations

import json
import signal

import pytest

from support.cache import NODE_FLAGS, Gate, RecordingClient
from support.node import start_node
from support.waiting import until
from tfscache import errors
from tfscache.cache.events import CacheEvents
from tfscache.cache.manager import CacheManager
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.settings import CacheSection

EMPTY = "model_config_list {}\n"


class Lost(CacheEvents):
    """Records the node_lost evictions."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, int]] = []

    def evicted(self, key, reason: str, size: int) -> None:
        if reason == "node_lost":
            self.keys.append(key)


class Restartable:
    """A ``tfscache node`` with a load gate, restarted on the same ports by ``restart``."""

    def __init__(self, directory, gate: Gate) -> None:
        self.directory, self.gate = directory, gate
        self.flags = [*NODE_FLAGS, f"--load_gate_dir={gate.dir}"]
        self.process = start_node(directory, config=EMPTY, flags=self.flags)
        self.target = self.process.grpc_target

    def kill(self) -> None:
        self.process.process.send_signal(signal.SIGKILL)
        self.process.process.wait()

    def restart(self) -> None:
        """Start it again where it was, with nothing loaded (TF Serving restarted by its supervisor)."""
        old = self.process
        self.process = start_node(self.directory, config=EMPTY, flags=[
            *self.flags, f"--port={old.grpc_port}", f"--rest_api_port={old.rest_port}"])

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture
async def setup(tmp_path, repository):
    """(node, cache, events, state file): a CacheManager over a fresh node, with a state file."""
    gate = Gate(tmp_path / "gate")
    gate.dir.mkdir()
    node = Restartable(tmp_path / "node", gate)
    client = RecordingClient(node.target, rpc_deadline_s=10.0)
    events = Lost()
    state = tmp_path / "node.cache.json"
    # No pid: the node is replaced on purpose, and only the two paths under test may notice.
    adapter = TFServingAdapter(client, repository, rpc_deadline_s=10.0, memory=NodeMemory(None))
    settings = CacheSection(room_timeout_s=30.0, reload_deadline_s=60.0, health_retry_s=0.2)
    cache = CacheManager(adapter, repository, settings, state_file=state, events=events)
    try:
        await cache.start()
        await cache.wait_synced(60)
        yield node, cache, events, state
    finally:
        await cache.stop()
        await client.close()
        node.stop()


def models(cache) -> list[tuple[str, str, bool]]:
    return sorted((m.name, m.state, m.pinned) for m in cache.snapshot())


async def saved_pins(cache, state) -> dict[str, bool]:
    await cache.flush_state()
    return {m["name"]: m["pinned"] for m in json.loads(state.read_text())["models"]}


async def test_recover_keeps_the_pin_of_a_model_the_node_lost_and_loads_it_again(setup):
    node, cache, events, state = setup
    await cache.pin("addk_1")
    (await cache.acquire("addk_2")).release()
    node.kill()
    with pytest.raises(errors.NodeUnavailable):  # the check meets the dead node: the cache turns unhealthy
        await cache.recheck()
    assert not cache.healthy
    # The restarted node fails its reload of addk_1 (then keeps it failed: TF Serving's sticky
    # version), so recover finds it lost; addk_2 loads again with the config recover sends.
    node.gate.fail("addk_1")
    node.restart()
    assert await cache.wait_ready(60)
    # As in the resync test: this resumes before the task that loads addk_1 again starts.
    node.gate.unfail("addk_1")
    assert ("addk_1", 1) in events.keys and ("addk_2", 1) not in events.keys
    assert (await saved_pins(cache, state)).get("addk_1") is True  # the pin survives, on disk too
    await until(lambda: models(cache) == [("addk_1", "available", True),
                                          ("addk_2", "available", False)], 60,
                "addk_1 to be loaded and pinned again")
    assert (await saved_pins(cache, state)) == {"addk_1": True, "addk_2": False}


async def test_resync_keeps_the_pin_of_a_model_the_node_lost_and_loads_it_again(setup):
    node, cache, events, state = setup
    await cache.pin("addk_1")
    node.kill()
    node.gate.fail("addk_1")  # the restarted node fails the resync's reload of addk_1: it is lost
    node.restart()
    await cache.recheck()  # the cache was healthy throughout: it finds the loss by checking
    # The recheck's caller resumes before the task that loads addk_1 again even starts (it is
    # scheduled after the caller's wake-up, and resolves the version in a worker thread first),
    # so that load meets a gate that lets it pass.
    node.gate.unfail("addk_1")
    assert ("addk_1", 1) in events.keys
    assert (await saved_pins(cache, state)).get("addk_1") is True
    await until(lambda: models(cache) == [("addk_1", "available", True)], 60,
                "addk_1 to be loaded and pinned again")
    assert cache.healthy
    assert (await saved_pins(cache, state)) == {"addk_1": True}
