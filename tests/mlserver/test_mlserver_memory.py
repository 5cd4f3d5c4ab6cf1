"""The memory cap (``--memory-per-node``) on an MLServer node, with padded scikit-learn models.

Three models each pickle ``PADDING`` bytes with them (support.models.mlserver:
``padded``), so the inference worker that loads one really holds them; the cap lets two fit,
not three. A first request for ``addk_1`` imports scikit-learn into the worker (what the
process tree holds after it is the base). Requests for the three in turn succeed, the node's
own repository index (sampled throughout, one REST call per sample) never shows three of
them resident at once, and the process tree (mlserver and its workers) grows by at most
the cap.
"""

from __future__ import annotations

import pytest
import tritonclient.grpc as tritongrpc

from support.serving import start_serve
from support.mlserver import PYTHON, IndexSampler, mlserver_infer, serve_nodes
from support.oip import tree_rss
from support.models.mlserver import build_mlserver_models

MIB = 1 << 20
PADDING = 80 * MIB
CAP = 200 * MIB  # two padded models (~82 MiB each) fit, three do not
MODELS = {"pad_a": 21, "pad_b": 22, "pad_c": 23}
ROUNDS = 3


@pytest.fixture(scope="module")
def padded_serve(tmp_path_factory, mlserver_bin):
    repository = tmp_path_factory.mktemp("padded-repository")
    build_mlserver_models(repository, PYTHON, synthetic=1, padding_bytes=PADDING, padded=MODELS,
                          classifier=False, xgboost=False)
    with start_serve(tmp_path_factory.mktemp("padded-serve"), repository, "--backend", "mlserver",
                     "--local-nodes", "1", "--node-command", mlserver_bin, "--memory-per-node", str(CAP)) as serve:
        yield serve


def test_the_memory_cap_holds_from_the_first_loads_on(padded_serve):
    node = serve_nodes(padded_serve)["node0"]
    client = tritongrpc.InferenceServerClient(padded_serve.grpc_target)
    try:
        assert mlserver_infer(tritongrpc, client, "addk_1", 1.0) == [2.0]
        base = tree_rss(node["pid"])
        answers, rss = [], []
        with IndexSampler({"node0": f"http://127.0.0.1:{node['rest']}"}) as sampler:
            for r in range(ROUNDS):
                for name in MODELS:
                    answers.append((name, r, mlserver_infer(tritongrpc, client, name, float(r))))
                    rss.append(tree_rss(node["pid"]))
    finally:
        client.close()
    assert answers == [(name, r, [r + k]) for r in range(ROUNDS) for name, k in MODELS.items()]
    padded = [s & set(MODELS) for s in sampler.samples["node0"]]
    print(f"index samples {len(padded)}; base {base / MIB:.0f} MiB; tree RSS after each request (MiB): "
          f"{[round(b / MIB) for b in rss]}")
    assert padded and sampler.errors == 0
    assert max(map(len, padded)) == 2, [sorted(s) for s in padded if len(s) > 2][:3]
    assert max(rss) - base <= CAP, [round(b / MIB) for b in rss]
