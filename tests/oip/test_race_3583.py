"""The triton-inference-server/server#3583 race, both ways, on each OIP kind (docs/upstream/triton.md,
"In-flight requests during unload (the server#3583 race)"; MLServer has it too).

* Raw server: two clients, each doing load, infer and unload of the same model in a loop.
  When one client's unload lands between the other's load and infer, that infer fails with
  the server's own error: Triton's NOT_FOUND "has no available versions" (no version asked) or
  UNAVAILABLE "version 1 is not at ready state" (version 1 asked); MLServer's NOT_FOUND "Model
  NAME with version V not found" (V empty when no version is asked). The steps are put in that
  order by a script of turns (one threading.Event per step), not by luck.
* Through tfscache: the same two clients only infer; tfscache loads and unloads for them, on
  one node capped at one model, with two models alternating, so every switch forces the other
  model's eviction. Not one request fails, and the node never holds two models.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as tritongrpc
from support import mlserver as mlsupport
from support import triton as tritonsupport
from support.traffic import addk_of
from tritonclient.utils import InferenceServerException

MODEL = "addk_3"
ROUNDS = 4
SERVE_ARGS = ("--local-nodes", "1", "--max-models-per-node", "1")  # Triton's ``served`` (conftest)


def triton_infer(client: tritongrpc.InferenceServerClient, name: str, x: float, version: str = "",
                 timeout: float = 60.0) -> list[float]:
    tensor = tritongrpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    return client.infer(name, [tensor], model_version=version, client_timeout=timeout).as_numpy("y").tolist()


def mlserver_infer(client: tritongrpc.InferenceServerClient, name: str, x: float, version: str = "",
                   timeout: float = 120.0) -> list[float]:
    return mlsupport.mlserver_infer(tritongrpc, client, name, x, timeout=timeout, version=version)


def triton_failures_met(failed: list[tuple[str, str]]) -> None:
    texts = {f"Request for unknown model: '{MODEL}' has no available versions": "StatusCode.NOT_FOUND",
             f"Request for unknown model: '{MODEL}' version 1 is not at ready state":
                 "StatusCode.UNAVAILABLE",
             f"Request for unknown model: '{MODEL}' is not found": "StatusCode.NOT_FOUND"}
    for status, message in failed:
        assert texts.get(message) == status, (status, message)
    # Both forms of the race were met: no version asked, and version 1 asked.
    assert {status for status, _ in failed} == {"StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"}, failed


def mlserver_failures_met(failed: list[tuple[str, str]]) -> None:
    assert set(failed) == {("StatusCode.NOT_FOUND", f"Model {MODEL} with version  not found"),
                           ("StatusCode.NOT_FOUND", f"Model {MODEL} with version 1 not found")}, failed


@dataclass(frozen=True)
class Dialect:
    """What differs between the kinds in these tests."""

    infer: Callable[..., list[float]]  # (client, name, x, version="", timeout=...) -> y
    unload_may_miss: bool  # an unload of a model the other client unloaded first is NOT_FOUND
    failures_met: Callable[[list[tuple[str, str]]], None]  # asserts the raw race's failed infers
    nodes: Callable  # serve -> {"node0": {"grpc", "rest", ...}}
    sampled: Callable[[dict], str]  # a node's ports -> what its IndexSampler samples
    sampler: type  # the kind's IndexSampler (tests/support)
    log_tail: bool  # name the serve's log in a failure


DIALECTS = {
    "triton": Dialect(triton_infer, False, triton_failures_met, tritonsupport.serve_triton_nodes,
                      lambda node: f"127.0.0.1:{node['grpc']}", tritonsupport.IndexSampler, False),
    "mlserver": Dialect(mlserver_infer, True, mlserver_failures_met, mlsupport.serve_nodes,
                        lambda node: f"http://127.0.0.1:{node['rest']}", mlsupport.IndexSampler, True),
}


class Turns:
    """A script of (client, step) turns: each client waits for its turn, does its step, passes on."""

    def __init__(self, script: list[tuple[str, str]]) -> None:
        self.script = script
        self._events = [threading.Event() for _ in script]
        self._events[0].set()

    def steps(self, who: str):
        for i, (client, step) in enumerate(self.script):
            if client != who:
                continue
            assert self._events[i].wait(120), f"{who} never got turn {i} ({step})"
            yield step
            if i + 1 < len(self._events):
                self._events[i + 1].set()


def test_the_raw_server_fails_a_request_when_another_client_unloads_between_load_and_infer(kind, raw):
    dialect = DIALECTS[kind]
    # Each round: both clients load; the first infers and unloads; the second's infer comes
    # after that unload (its own load returned just before). The roles swap each round, and
    # odd rounds ask for version 1 by number.
    script: list[tuple[str, str]] = []
    for r in range(ROUNDS):
        first, second = ("A", "B") if r % 2 == 0 else ("B", "A")
        script += [(second, "load"), (first, "load"), (first, "infer"), (first, "unload"),
                   (second, "infer"), (second, "unload")]
    turns = Turns(script)
    results: dict[str, list[tuple[str, object]]] = {"A": [], "B": []}

    def unload(grpc_client) -> None:
        try:
            grpc_client.unload_model(MODEL, client_timeout=60)
        except InferenceServerException as exc:  # the other client's unload came first
            if not (dialect.unload_may_miss and exc.status() == "StatusCode.NOT_FOUND"):
                raise

    def client(who: str) -> None:
        grpc_client = tritongrpc.InferenceServerClient(raw.grpc_target)
        infers = 0
        try:
            for step in turns.steps(who):
                try:
                    if step == "load":
                        outcome = grpc_client.load_model(MODEL, client_timeout=60)
                    elif step == "unload":
                        outcome = unload(grpc_client)
                    else:
                        version = "1" if infers % 2 else ""  # every other infer names version 1
                        outcome = dialect.infer(grpc_client, MODEL, 1.0, version)
                        infers += 1
                except InferenceServerException as exc:
                    outcome = exc
                results[who].append((step, outcome))
        finally:
            grpc_client.close()

    threads = [threading.Thread(target=client, args=(who,)) for who in "AB"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads)

    # Replay the script against each client's results, in order.
    cursors = {"A": iter(results["A"]), "B": iter(results["B"])}
    served, failed = [], []
    for i, (who, step) in enumerate(script):
        done, outcome = next(cursors[who])
        assert done == step
        if step != "infer":
            assert outcome is None, (i, who, step, outcome)  # loads and unloads never fail
        elif script[i - 1][1] == "unload":
            failed.append(outcome)  # the other client unloaded after this one's load
        else:
            served.append(outcome)
    assert served == [[1.0 + addk_of(MODEL)]] * ROUNDS
    assert len(failed) == ROUNDS
    assert all(isinstance(exc, InferenceServerException) for exc in failed), failed
    dialect.failures_met([(exc.status(), exc.message()) for exc in failed])


def test_through_tfscache_the_same_traffic_fails_nothing(kind, cap_one):
    dialect = DIALECTS[kind]
    models = ["addk_1", "addk_2"]
    per_client = 6
    results: dict[int, list[tuple[str, float, object]]] = {0: [], 1: []}
    node = dialect.nodes(cap_one)["node0"]

    def client(worker: int) -> None:
        grpc_client = tritongrpc.InferenceServerClient(cap_one.grpc_target)
        try:
            for i in range(per_client):
                name, x = models[(worker + i) % 2], float(worker * 100 + i)  # the two clients cross
                try:
                    outcome = dialect.infer(grpc_client, name, x, timeout=120)
                except InferenceServerException as exc:
                    outcome = exc
                results[worker].append((name, x, outcome))
        finally:
            grpc_client.close()

    with dialect.sampler({"node0": dialect.sampled(node)}) as sampler:
        threads = [threading.Thread(target=client, args=(w,)) for w in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not any(thread.is_alive() for thread in threads)
    answers = [r for w in (0, 1) for r in results[w]]
    assert len(answers) == 2 * per_client
    failures = [(name, outcome.status(), outcome.message()) for name, _, outcome in answers
                if isinstance(outcome, Exception)]
    assert not failures, (failures, cap_one.log_text()[-3000:] if dialect.log_tail else "")
    assert all(y == [x + addk_of(name)] for name, x, y in answers), answers
    # The node held one model at every sample, and both models came and went.
    assert sampler.count() > 0 and sampler.peak("node0") == 1, sampler.samples
    seen = [frozenset(s) for s in sampler.samples["node0"] if s]
    switches = sum(1 for a, b in zip(seen, seen[1:]) if a != b)
    assert switches >= 2, seen
