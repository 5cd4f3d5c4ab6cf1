"""Fixtures for the cache-manager tests: one real ``tfscache node`` for the session.

* ``repo_root`` / ``repository``: a model repository (``ROOT/addk_<k>/1``) of small synthetic models
  addk_1..addk_12 (y = x + k), copied from the session's built models so a test may
  delete or add directories without touching other suites.
* ``node``: a ``tfscache node`` with an empty config, a fast file-system poll, no load
  retries, four load threads and a load gate (``--load_gate_dir``), shared by every
  module here (a node start costs TensorFlow's import). Every ``make_cache`` starts a
  CacheManager with no state file, which clears the node, so tests sharing a node do not
  see each other's models; a test that counts lines of the node's log counts those it caused.
* ``gate``: holds/fails loads deterministically (see ``Gate``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.cache import MODEL_BYTES, NODE_FLAGS, NUM_MODELS, AsyncNode, Gate, RecordingClient
from support.node import start_node
from tfscache.kinds.nodepid import NodeMemory
from tfscache.cache.manager import CacheManager
from tfscache.settings import CacheSection
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.kinds.tfserving.client import NodeClient
from tfscache.repository.local import ModelRepository


@pytest.fixture(scope="module")
def repo_root(synthetic_models, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for base in synthetic_models(range(1, NUM_MODELS + 1), size_bytes=MODEL_BYTES):
        shutil.copytree(base, root / base.name)
    return root


@pytest.fixture(scope="session")
def gate(tmp_path_factory) -> Gate:
    return Gate(tmp_path_factory.mktemp("gate"))


@pytest.fixture(scope="session")
def node(tmp_path_factory, gate):
    with start_node(tmp_path_factory.mktemp("node"), config="model_config_list {}\n",
                    flags=[*NODE_FLAGS, f"--load_gate_dir={gate.dir}"]) as process:
        yield process


@pytest.fixture
def repository(repo_root) -> ModelRepository:
    return ModelRepository(repo_root, rescan_s=0.0)


@pytest.fixture
async def make_cache(node, repository, gate):
    """Factory: ``await make_cache(max_models=3, ...)`` -> a started CacheManager on ``node``."""
    made: list[tuple[CacheManager, NodeClient]] = []

    async def make(state_file: Path | None = None, memory=None, **settings) -> CacheManager:
        """``memory``: the node's memory as the cache reads it (default: the node process's RSS)."""
        settings.setdefault("room_timeout_s", 30.0)
        settings.setdefault("reload_deadline_s", 60.0)
        client = RecordingClient(node.grpc_target, rpc_deadline_s=10.0)
        adapter = TFServingAdapter(client, repository, rpc_deadline_s=10.0,
                                   memory=memory if memory is not None else NodeMemory(node.pid))
        cache = CacheManager(adapter, repository, CacheSection(**settings), state_file=state_file)
        made.append((cache, client))
        await cache.start()
        await cache.wait_synced(60)  # the node holds this cache's (empty) config, not a previous test's
        return cache

    yield make
    for cache, client in made:
        await cache.stop()
        await client.close()
    gate.clear()


@pytest.fixture
async def anode(node):
    client = AsyncNode(node.grpc_target)
    yield client
    await client.close()
