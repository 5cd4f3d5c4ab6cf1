"""The triton-inference-server/server#3583 race, both ways (triton-behavior.md §3).

* Raw Triton: two clients, each doing load, infer and unload of the same model in a loop.
  When one client's unload lands between the other's load and infer, that infer fails with
  Triton's own NOT_FOUND "has no available versions" (no version asked) or UNAVAILABLE
  "version 1 is not at ready state" (version 1 asked). The steps are put in that order by
  a script of turns (one threading.Event per step), not by luck.
* Through tfscache: the same two clients only infer; tfscache loads and unloads for them,
  on one node capped at one model, with two models alternating, so every switch forces the
  other model's eviction. Not one request fails, and the node never holds two models.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from support.traffic import addk_of
from support.triton import IndexSampler, serve_triton_nodes

MODEL = "addk_3"
ROUNDS = 4


def infer(client: tritongrpc.InferenceServerClient, name: str, x: float, version: str = "",
          timeout: float = 60.0) -> list[float]:
    tensor = tritongrpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    return client.infer(name, [tensor], model_version=version, client_timeout=timeout).as_numpy("y").tolist()


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


def test_raw_triton_fails_a_request_when_another_client_unloads_between_load_and_infer(triton):
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

    def client(who: str) -> None:
        grpc_client = tritongrpc.InferenceServerClient(triton.grpc_target)
        infers = 0
        try:
            for step in turns.steps(who):
                try:
                    if step == "load":
                        grpc_client.load_model(MODEL, client_timeout=60)
                        outcome = None
                    elif step == "unload":
                        grpc_client.unload_model(MODEL, client_timeout=60)
                        outcome = None
                    else:
                        version = "1" if infers % 2 else ""  # every other infer names version 1
                        outcome = infer(grpc_client, MODEL, 1.0, version)
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
    texts = {f"Request for unknown model: '{MODEL}' has no available versions": "StatusCode.NOT_FOUND",
             f"Request for unknown model: '{MODEL}' version 1 is not at ready state": "StatusCode.UNAVAILABLE",
             f"Request for unknown model: '{MODEL}' is not found": "StatusCode.NOT_FOUND"}
    for exc in failed:
        assert isinstance(exc, InferenceServerException), exc
        assert texts.get(exc.message()) == exc.status(), (exc.status(), exc.message())
    # Both forms of §3 were met: no version asked, and version 1 asked.
    assert {exc.status() for exc in failed} == {"StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"}, \
        [(exc.status(), exc.message()) for exc in failed]


SERVE_ARGS = ("--local-nodes", "1", "--max-models-per-node", "1")  # conftest's ``served``


@pytest.fixture(scope="module")
def cap_one(served):
    return served[0]


def test_through_tfscache_the_same_traffic_fails_nothing(cap_one):
    models = ["addk_1", "addk_2"]
    per_client = 6
    results: dict[int, list[tuple[str, float, object]]] = {0: [], 1: []}
    node = serve_triton_nodes(cap_one)["node0"]
    target = f"127.0.0.1:{node['grpc']}"

    def client(worker: int) -> None:
        grpc_client = tritongrpc.InferenceServerClient(cap_one.grpc_target)
        try:
            for i in range(per_client):
                name, x = models[(worker + i) % 2], float(worker * 100 + i)  # the two clients cross
                try:
                    outcome = infer(grpc_client, name, x, timeout=120)
                except InferenceServerException as exc:
                    outcome = exc
                results[worker].append((name, x, outcome))
        finally:
            grpc_client.close()

    with IndexSampler({"node0": target}) as sampler:
        threads = [threading.Thread(target=client, args=(w,)) for w in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not any(thread.is_alive() for thread in threads)
    answers = [r for w in (0, 1) for r in results[w]]
    assert len(answers) == 2 * per_client
    failures = [(name, outcome) for name, _, outcome in answers if isinstance(outcome, Exception)]
    assert not failures, failures
    assert all(y == [x + addk_of(name)] for name, x, y in answers), answers
    # The node held one model at every sample, and both models came and went.
    assert sampler.count() > 0 and sampler.peak("node0") == 1, sampler.samples
    seen = [frozenset(s) for s in sampler.samples["node0"] if s]
    switches = sum(1 for a, b in zip(seen, seen[1:]) if a != b)
    assert switches >= 2, seen
