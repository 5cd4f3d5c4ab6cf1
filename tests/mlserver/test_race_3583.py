"""The triton-inference-server/server#3583 race, on MLServer, both ways.

* Raw MLServer: two clients, each doing load, infer and unload of the same model in a loop.
  When one client's unload lands between the other's load and infer, that infer fails with
  MLServer's NOT_FOUND "Model NAME with version V not found" (V empty when no version is
  asked). The steps are put in that order by a script of turns (one threading.Event per
  step), not by luck.
* Through tfscache: the same two clients only infer; tfscache loads and unloads for them, on
  one node capped at one model, with two models alternating, so every switch forces the other
  model's eviction. Not one request fails, and the node's index never shows two models.
"""

from __future__ import annotations

import threading

import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from frontend.serving import start_serve
from support.mlserver import PATIENT, IndexSampler, mlserver_infer, serve_nodes
from support.traffic import addk_of

MODEL = "addk_3"
ROUNDS = 4


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


def test_raw_mlserver_fails_a_request_when_another_client_unloads_between_load_and_infer(mlserver):
    script: list[tuple[str, str]] = []
    for r in range(ROUNDS):
        first, second = ("A", "B") if r % 2 == 0 else ("B", "A")
        script += [(second, "load"), (first, "load"), (first, "infer"), (first, "unload"),
                   (second, "infer"), (second, "unload")]
    turns = Turns(script)
    results: dict[str, list[tuple[str, object]]] = {"A": [], "B": []}

    def client(who: str) -> None:
        grpc_client = tritongrpc.InferenceServerClient(mlserver.grpc_target)
        infers = 0
        try:
            for step in turns.steps(who):
                try:
                    if step == "load":
                        outcome = grpc_client.load_model(MODEL, client_timeout=60)
                    elif step == "unload":
                        try:
                            outcome = grpc_client.unload_model(MODEL, client_timeout=60)
                        except InferenceServerException as exc:  # the other client's unload came first
                            outcome = None if exc.status() == "StatusCode.NOT_FOUND" else exc
                    else:
                        version = "1" if infers % 2 else ""  # every other infer names version 1
                        outcome = mlserver_infer(tritongrpc, grpc_client, MODEL, 1.0, version=version)
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
    cursors = {"A": iter(results["A"]), "B": iter(results["B"])}
    served, failed = [], []
    for i, (who, step) in enumerate(script):
        done, outcome = next(cursors[who])
        assert done == step
        if step != "infer":
            assert outcome is None, (i, who, step, outcome)
        elif script[i - 1][1] == "unload":
            failed.append(outcome)  # the other client unloaded after this one's load
        else:
            served.append(outcome)
    assert served == [[1.0 + addk_of(MODEL)]] * ROUNDS
    assert len(failed) == ROUNDS
    texts = {(exc.status(), exc.message()) for exc in failed}
    assert texts == {("StatusCode.NOT_FOUND", f"Model {MODEL} with version  not found"),
                     ("StatusCode.NOT_FOUND", f"Model {MODEL} with version 1 not found")}, texts


@pytest.fixture(scope="module")
def cap_one(tmp_path_factory, mlserver_repository, mlserver_bin):
    with start_serve(tmp_path_factory.mktemp("race-serve"), mlserver_repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", mlserver_bin, "--max-models-per-node", "1",
                     *PATIENT) as serve:
        yield serve


def test_through_tfscache_the_same_traffic_fails_nothing(cap_one):
    models = ["addk_1", "addk_2"]
    per_client = 6
    results: dict[int, list[tuple[str, float, object]]] = {0: [], 1: []}
    node = serve_nodes(cap_one)["node0"]

    def client(worker: int) -> None:
        grpc_client = tritongrpc.InferenceServerClient(cap_one.grpc_target)
        try:
            for i in range(per_client):
                name, x = models[(worker + i) % 2], float(worker * 100 + i)  # the two clients cross
                try:
                    outcome = mlserver_infer(tritongrpc, grpc_client, name, x)
                except InferenceServerException as exc:
                    outcome = exc
                results[worker].append((name, x, outcome))
        finally:
            grpc_client.close()

    with IndexSampler({"node0": f"http://127.0.0.1:{node['rest']}"}) as sampler:
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
    assert not failures, (failures, cap_one.log_text()[-3000:])
    assert all(y == [x + addk_of(name)] for name, x, y in answers), answers
    assert sampler.count() > 0 and sampler.peak("node0") == 1, sampler.samples
    seen = [frozenset(s) for s in sampler.samples["node0"] if s]
    assert sum(1 for a, b in zip(seen, seen[1:]) if a != b) >= 2, seen
