"""Draining, against real ``tfscache serve`` processes with real ``tfscache node`` children.

* one node of ``--local-nodes 2 --replicas-per-model 2`` drains while clients drive steady
  traffic: no request fails, the node ends empty and off the ring;
* the whole process drains through the admin API: health NOT_SERVING, models unloaded, exit 0;
* SIGTERM: health NOT_SERVING before the server stops, exit 0.

No sleeps: clients count their requests and the test waits for counts and states.
"""

from __future__ import annotations

import functools
import signal
import threading
import time

import grpc
from grpc_health.v1 import health_pb2
import pytest

from support.admin import health_check, predict, start_admin_serve
from support.process import started_together
from tfscache.admin.client import AdminClient
from tfscache.cluster.ring import Ring

MODELS = [f"addk_{k}" for k in range(1, 7)]
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Traffic:
    """Client threads, each predicting every model in turn and checking every answer."""

    def __init__(self, target: str, threads: int = 4) -> None:
        self.counts = [0] * threads
        self.failures: list[str] = []
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(target)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        self._channel.close()

    def _run(self, index: int) -> None:
        i = index
        while not self._stop.is_set():
            name = MODELS[i % len(MODELS)]
            i += 1
            try:
                y = predict(self._channel, name, 1.0, timeout=60)
                ok = y == [1.0 + int(name[5:])]
                problem = None if ok else f"{name}: wrong answer {y}"
            except grpc.RpcError as exc:
                problem = f"{name}: {exc.code().name}: {exc.details()}"
            with self._changed:
                if problem:
                    self.failures.append(problem)
                self.counts[index] += 1
                self._changed.notify_all()

    def wait_each(self, at_least: list[int], timeout: float = 120.0) -> list[int]:
        """Wait until every thread has made ``at_least[i]`` requests; the counts then."""
        with self._changed:
            assert self._changed.wait_for(lambda: all(c >= n for c, n in zip(self.counts, at_least)), timeout), \
                (self.counts, at_least, self.failures[:5])
            return list(self.counts)


@pytest.fixture(scope="module")
def serves(admin_repo, tmp_path_factory):
    """The module's three serves, started at once: ``two_nodes``'s and ``ending``'s two."""
    directory = tmp_path_factory.mktemp("drain")
    ending = functools.partial(start_admin_serve, directory, admin_repo, "--local-nodes", "1",
                               "--set", "server.grace_s=1")
    with started_together([
            functools.partial(start_admin_serve, directory, admin_repo, "--local-nodes", "2",
                              "--replicas-per-model", "2", "--set", "server.grace_s=2"),
            ending, ending]) as started:
        yield started


@pytest.fixture(scope="module")
def two_nodes(serves):
    return serves[0]


def test_draining_one_of_two_replicas_fails_no_request(two_nodes):
    ring = Ring(["node0", "node1"], replicas=2)
    first_on_node1 = [m for m in MODELS if ring.replicas_for(m)[0] == "node1"]
    assert first_on_node1 and len(first_on_node1) < len(MODELS)  # both nodes take traffic
    with AdminClient(two_nodes.admin_target) as admin:
        for name in MODELS:  # on both replicas: requests go to the first in ring order
            assert sorted(r.node for r in admin.preload(name).results) == ["node0", "node1"]
        loaded_at = time.time()
        with Traffic(two_nodes.grpc_target) as traffic:
            before = traffic.wait_each([20] * 4)
            # node1 is serving its share before the drain starts
            node1 = admin.list_models("node1").nodes[0]
            assert {m.name for m in node1.models if m.last_use > loaded_at} >= set(first_on_node1)
            progress = list(admin.drain("node1"))
            at_done = traffic.wait_each([c + 1 for c in before])
            traffic.wait_each([c + 20 for c in at_done])  # and traffic goes on without node1
        assert traffic.failures == []
        assert sum(traffic.counts) >= 4 * 41
        assert progress[0].models_total == len(MODELS)
        assert (progress[-1].done, progress[-1].models_left, progress[-1].phase) == (True, 0, "done")
        node0, node1 = admin.list_models().nodes
        assert (node1.node, node1.draining, list(node1.models)) == ("node1", True, [])
        assert (node0.draining, sorted(m.name for m in node0.models)) == (False, MODELS)
        assert health_check(two_nodes.grpc_target) == SERVING  # the process serves on with node0
        assert predict(grpc.insecure_channel(two_nodes.grpc_target), first_on_node1[0], 2.0) == [
            2.0 + int(first_on_node1[0][5:])]
        assert admin.list_models("node1").nodes[0].models == []  # not loaded there again


class Watch:
    """A health Watch stream read by a thread; ``statuses`` in arrival order."""

    def __init__(self, target: str) -> None:
        self.statuses: list[int] = []
        self._changed = threading.Condition()
        self._channel = grpc.insecure_channel(target)
        watch = self._channel.unary_stream("/grpc.health.v1.Health/Watch",
                                           request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                           response_deserializer=health_pb2.HealthCheckResponse.FromString)
        self._call = watch(health_pb2.HealthCheckRequest(service=""))
        self.ended: grpc.StatusCode | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self._call:
                with self._changed:
                    self.statuses.append(response.status)
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            self.ended = exc.code()

    def wait_for(self, statuses: list[int], timeout: float = 60.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.statuses == statuses, timeout), self.statuses

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()


@pytest.fixture(scope="module")
def ending(serves):
    """A serve of its own (one node, grace 1 s) for each test below that ends it."""
    return {"drain": serves[1], "sigterm": serves[2]}


def test_draining_the_process_unloads_everything_and_exits_0(ending):
    serve = ending["drain"]
    with AdminClient(serve.admin_target) as admin:
        admin.preload("addk_1")
        admin.pin("addk_2")
        watch = Watch(serve.grpc_target)
        try:
            watch.wait_for([SERVING])
            progress = list(admin.drain())
            watch.wait_for([SERVING, NOT_SERVING])
        finally:
            watch.close()
    assert progress[0].models_total == 2
    assert (progress[-1].done, progress[-1].models_left) == (True, 0)
    assert serve.process.wait(60) == 0
    log = serve.log_text()
    assert "health: NOT_SERVING (draining)" in log
    assert "draining: unloading" in log and "drained: every model unloaded; exiting" in log
    assert log.index("health: NOT_SERVING") < log.index("drained: every model unloaded")


def test_sigterm_turns_health_not_serving_first_and_exits_0(ending):
    serve = ending["sigterm"]
    assert predict(grpc.insecure_channel(serve.grpc_target), "addk_1", 1.0) == [2.0]
    watch = Watch(serve.grpc_target)
    try:
        watch.wait_for([SERVING])
        serve.process.send_signal(signal.SIGTERM)
        watch.wait_for([SERVING, NOT_SERVING])  # seen before the server went away
    finally:
        watch.close()
    assert serve.process.wait(60) == 0
