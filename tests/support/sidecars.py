"""In-process sidecars (ServeApp) over real nodes, as the sidecar tests run them.

    async with running_sidecars({"a": node_a, "b": node_b}, repo, tmp_path) as apps:
        apps["a"].grpc_port ...

Each sidecar binds port 0 on 127.0.0.1 and is told every sidecar's address once all
started, as discovery would do. The nodes are started with ``EMPTY`` and ``NODE_FLAGS``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.node import version_status_at
from support.requests import predict_request
from tfscache import settings as settings_mod
from tfscache.discovery import Peer
from tfscache.app import ServeApp

EMPTY = "model_config_list {\n}\n"
NODE_FLAGS = ["--max_num_load_retries=0", "--num_load_threads=2"]


def sidecar_settings(name: str, node, repo: Path, state_dir: Path, overrides: dict | None = None):
    """Settings of sidecar ``name`` in front of ``node``, with its state in ``state_dir / name``
    (``overrides``: more settings by dotted name)."""
    return settings_mod.load(env={}, overrides={
        "model_repository": str(repo), "node.node_address": f"127.0.0.1:{node.grpc_port},{node.rest_port}",
        "ring.self_name": name, "server.bind_address": "127.0.0.1", "server.grpc_port": 0,
        "server.rest_port": 0, "node.state_dir": str(state_dir / name), **(overrides or {})})


@contextlib.asynccontextmanager
async def running_sidecars(nodes: dict, repo: Path, state_dir: Path,
                           overrides: dict | None = None, *, each: dict | None = None,
                           prepare=None) -> AsyncIterator[dict[str, ServeApp]]:
    """Start a sidecar per {name: node}, each a peer of all; {name: ServeApp}, stopped on exit.
    ``each``: {name: more settings} for some of them; ``prepare(name, app)`` runs before each
    start (a test's clock, say)."""
    apps = {name: ServeApp(sidecar_settings(name, node, repo, state_dir,
                                            {**(overrides or {}), **(each or {}).get(name, {})}))
            for name, node in nodes.items()}
    for name, app in apps.items():
        if prepare is not None:
            prepare(name, app)
        await app.start()
    peers = [Peer(name, f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.rest_port}") for name, app in apps.items()]
    for app in apps.values():
        await app.set_peers(peers)
    try:
        yield apps
    finally:
        for app in apps.values():
            await app.stop(grace=1)


def node_holds(node, name) -> bool:
    """Whether ``node`` itself has a version of ``name`` AVAILABLE (state 30)."""
    return any(s.state == 30 for s in version_status_at(node.grpc_target, name))


async def predict(app, name, x, metadata=None):
    """Predict ``name`` on ``x`` through an in-process sidecar's gRPC port."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return await stub.Predict(predict_request(name, x), timeout=60, metadata=metadata)
