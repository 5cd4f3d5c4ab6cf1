"""Fixtures for `tfscache serve --workers N` (tfscache.workers).

* ``workers_repo``: addk_1 .. addk_6 (y = x + k) for the session.
* ``gate_repo``: the ``gate`` model (a request blocks until released) and addk_1, for the session.
* ``gate_app`` (package): a control process in the test's own process (``ServeApp``: the test sees
  what the workers report and reaches the pool), two real workers and one real node over
  ``gate_repo``. A test using it leaves it serving with two workers.
* ``worker_pids(pid)``: the pids of a serve's worker processes (its children running
  tfscache.workers.worker), read from /proc through psutil.
* ``StatusSampler``: what a TF Serving node holds, sampled while traffic runs (caps at every instant).
"""

from __future__ import annotations

import threading

import psutil
import pytest
import pytest_asyncio
from support.serving import link_repository
from support.node import node_template, version_status

from tfscache import settings as settings_mod
from tfscache.app import ServeApp
from support.models.tfserving import build_gate


@pytest.fixture(scope="session")
def workers_repo(synthetic_models, tmp_path_factory):
    return link_repository(tmp_path_factory.mktemp("workers") / "models", synthetic_models(6))


@pytest.fixture(scope="session")
def gate_repo(tmp_path_factory, synthetic_models):
    root = tmp_path_factory.mktemp("gate-repo")
    build_gate(root / "built")
    return link_repository(root / "models", [root / "built" / "gate", *synthetic_models(1)])


def serve_settings(repo, state_dir):
    """``tfscache serve --workers 2 --local-nodes 1`` over ``repo``, ports picked at start."""
    return settings_mod.load(None, {}, {
        "model_repository": str(repo), "server.workers": 2, "node.local_nodes": 1,
        "server.grpc_port": 0, "server.rest_port": 0, "server.bind_address": "127.0.0.1",
        "node.state_dir": str(state_dir), "node.template_socket": node_template()})


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def gate_app(gate_repo, tmp_path_factory):
    """The started ServeApp; ``gate_app.target``: its public gRPC address. Its tests run on the
    package's event loop (``pytest.mark.asyncio(loop_scope="package")``)."""
    app = ServeApp(serve_settings(gate_repo, tmp_path_factory.mktemp("gate-app") / "state"))
    grpc_port, _ = await app.start()
    app.target = f"127.0.0.1:{grpc_port}"
    try:
        yield app
    finally:
        await app.stop(0)


def worker_pids(pid: int) -> list[int]:
    """The live worker processes under serve process ``pid``."""
    pids = []
    for child in psutil.Process(pid).children():
        try:
            if "tfscache.workers.worker" in child.cmdline():
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(pids)


class StatusSampler:
    """Samples a TF Serving node's own GetModelStatus for every model, over and over, in a thread.

    One sample is a forward sweep over the models followed at once by a backward sweep; a model
    seen resident (START, LOADING, AVAILABLE or UNLOADING) in both was resident at the instant the
    forward sweep ended, so a sample's size is a sound lower bound on what the node held then
    (the argument of tests/support/cache.py's CapSampler).
    """

    RESIDENT = frozenset({10, 20, 30, 40})

    def __init__(self, target: str, names: list[str]) -> None:
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc

        self._channel = grpc.insecure_channel(target)
        self._stub = model_service_pb2_grpc.ModelServiceStub(self._channel)
        self.names = names
        self.samples: list[set[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-sampler")

    def _resident(self, name: str) -> bool:
        return any(s.state in self.RESIDENT for s in version_status(self._stub, name))

    def _run(self) -> None:
        while not self._stop.is_set():
            forward = [name for name in self.names if self._resident(name)]
            backward = [name for name in reversed(self.names) if self._resident(name)]
            self.samples.append(set(forward) & set(backward))
            self._stop.wait(0.01)  # pacing: leave the node's CPU to the traffic under test

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(60)
        self._channel.close()

    @property
    def peak(self) -> int:
        return max(map(len, self.samples), default=0)
