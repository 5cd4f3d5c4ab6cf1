"""The memory cap (``--memory-per-node``) on a Triton node, with padded python models.

Three models each hold ``PADDING`` bytes while loaded (support.models.triton.build_addk with
padding_bytes: the stub's RSS really grows by them); the cap lets two of them fit, not
three. Requests for all three in turn succeed, and the node's own RepositoryIndex (sampled
throughout: READY + LOADING + UNLOADING, so a model counts until Triton says it is gone)
never shows three resident at once, and the process tree (tritonserver and its stubs) grows
by at most the cap. Each test has its own serve, so its cache starts knowing no sizes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tritongrpc

from support.serving import start_serve
from support.oip import tree_rss
from support.triton import IndexSampler, index_states, oip_infer, resident_models, serve_triton_nodes
from support.models.triton import build_addk, build_late_free

MIB = 1 << 20
PADDING = 96 * MIB
# A padded model takes its padding plus a python stub (~40 MiB RSS): ~136 MiB. Two fit, three do not.
CAP = 340 * MIB
MODELS = {"pad_a": 21, "pad_b": 22, "pad_c": 23}
ROUNDS = 3


@pytest.fixture(scope="module")
def padded_repository(tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("padded-repository")
    for name, k in MODELS.items():
        build_addk(repository, k, padding_bytes=PADDING, name=name)
    return repository


@pytest.fixture
def padded_serve(tmp_path, padded_repository):
    """A fresh serve per test: what the cache learned of the models' sizes starts empty."""
    with start_serve(tmp_path, padded_repository, "--backend", "triton", "--local-nodes", "1",
                     "--memory-per-node", str(CAP)) as serve:
        yield serve


def run_rounds(serve, client, rounds: range, pid: int) -> tuple[list, list[int]]:
    """Infer each model in turn, ``rounds`` times: [(name, round, y)], tree RSS after each."""
    answers, rss = [], []
    for r in rounds:
        for name in MODELS:
            tensor = tritongrpc.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([float(r)], dtype=np.float32))
            answers.append((name, r, client.infer(name, [tensor], client_timeout=120).as_numpy("y").tolist()))
            rss.append(tree_rss(pid))
    return answers, rss


def expected(rounds: range) -> list:
    return [(name, r, [r + k]) for r in rounds for name, k in MODELS.items()]


def check_samples(sampler: IndexSampler, base: int, rss: list[int]) -> None:
    samples = sampler.samples["node0"]
    over = [(i, sorted(s)) for i, s in enumerate(samples) if len(s) > 2]
    print(f"index samples {len(samples)}, peak {sampler.peak('node0')}; server alone {base / MIB:.0f} MiB; "
          f"tree RSS after each request (MiB): {[round(b / MIB) for b in rss]}")
    assert not over, f"{len(over)} of {len(samples)} index samples show 3 resident; first: {over[:2]}"
    assert sampler.peak("node0") == 2
    assert max(rss) - base <= CAP, [round(b / MIB) for b in rss]


def test_once_sizes_are_learned_at_most_two_are_resident(padded_serve):
    serve = padded_serve
    node = serve_triton_nodes(serve)["node0"]
    target = f"127.0.0.1:{node['grpc']}"
    base = tree_rss(node["pid"])
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    try:
        # One round first: each model's first load is measured (its size learned from the growth
        # of the node's process tree); then two rounds under the sampler.
        assert run_rounds(serve, client, range(1), node["pid"])[0] == expected(range(1))
        # That round may have taken the node over the cap (see the next test); wait for it to fit.
        deadline = time.monotonic() + 60
        while len(resident_models(target)) > 2:
            assert time.monotonic() < deadline, resident_models(target)
            time.sleep(0.02)  # polling a condition with a deadline
        with IndexSampler({"node0": target}) as sampler:
            answers, rss = run_rounds(serve, client, range(1, ROUNDS), node["pid"])
    finally:
        client.close()
    assert answers == expected(range(1, ROUNDS))
    check_samples(sampler, base, rss)


def test_first_loads_hold_the_cap_too(padded_serve):
    serve = padded_serve
    node = serve_triton_nodes(serve)["node0"]
    base = tree_rss(node["pid"])
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    try:
        with IndexSampler({"node0": f"127.0.0.1:{node['grpc']}"}) as sampler:
            answers, rss = run_rounds(serve, client, range(ROUNDS), node["pid"])
    finally:
        client.close()
    assert answers == expected(range(ROUNDS))
    check_samples(sampler, base, rss)


def test_a_load_waits_until_an_unloaded_model_gives_its_memory_back(tmp_path):
    """Issue 23, item 5: ``late_a`` keeps its memory after its unload until the test releases it (its
    finalize() holds it: Triton shows it UNLOADING, the stub and its RSS stay). The cap has room for
    one padded model, so ``late_b`` must wait for that memory: no index sample ever shows both, and
    late_b is not even sent to the node before the release. (Triton keeps a python model UNLOADING
    until its stub exits, so here the adapter's wait for UNAVAILABLE and the measured-free rule,
    tfscache/cache/freeing.py, agree; tests/cache/test_freed_memory.py has a node that reports the
    version gone first.)"""
    repository, release = tmp_path / "late-repository", tmp_path / "release"
    build_late_free(repository, 31, PADDING, release, "late_a")
    build_late_free(repository, 32, PADDING, release, "late_b")
    with start_serve(tmp_path, repository, "--backend", "triton", "--local-nodes", "1",
                     "--memory-per-node", str(200 * MIB)) as serve:
        target = f"127.0.0.1:{serve_triton_nodes(serve)['node0']['grpc']}"
        assert oip_infer(serve.grpc_target, "late_a", 1.0, timeout=120) == [32.0]  # its size is learned
        answers: list = []
        with IndexSampler({"node0": target}) as sampler:
            second = threading.Thread(target=lambda: answers.append(oip_infer(serve.grpc_target, "late_b", 1.0,
                                                                              timeout=120)))
            second.start()
            deadline = time.monotonic() + 60
            while index_states(target).get("late_a") != {"UNLOADING"}:
                assert time.monotonic() < deadline, index_states(target)
                time.sleep(0.02)  # polling a condition with a deadline
            second.join(1.0)
            assert second.is_alive() and index_states(target).get("late_b") == {""}  # waits, never sent
            release.touch()
            second.join(120)
        assert answers == [[33.0]]
    assert sampler.peak("node0") == 1, sampler.samples["node0"][-20:]
