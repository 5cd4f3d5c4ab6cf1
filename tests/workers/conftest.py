"""Fixtures for `tfscache serve --workers N` (tfscache.workers).

* ``workers_repo``: addk_1 .. addk_6 (y = x + k) for the session.
* ``worker_pids(pid)``: the pids of a serve's worker processes (its children running
  tfscache.workers.worker), read from /proc through psutil.
* ``StatusSampler``: what a TF Serving node holds, sampled while traffic runs (caps at every instant).
"""

from __future__ import annotations

import threading

import psutil
import pytest
from frontend.serving import link_repository
from support.node import version_status


@pytest.fixture(scope="session")
def workers_repo(synthetic_models, tmp_path_factory):
    return link_repository(tmp_path_factory.mktemp("workers") / "models", synthetic_models(6))


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
    (the argument of tests/cache/cache_support.py's CapSampler).
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
