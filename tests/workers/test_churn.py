"""Churn through `tfscache serve --workers N` (N = 1, 2, 4), TF Serving kind: 16 clients over six
models on one node capped at two, gRPC and REST, for DURATION_S.

Not one request fails (evictions included), every answer is right (y = x + k), and the cap holds
at every instant, as the node's own GetModelStatus says (``StatusSampler``). N = 1 is the single
process (no worker spawned); N = 4 is more workers than the machine's cores.
"""

from __future__ import annotations

import json

import pytest
from support.serving import start_serve
from support.waiting import traffic_runs
from support.tfs_traffic import Traffic

from workers.conftest import StatusSampler, worker_pids

CAP = 2
DURATION_S = 5.0
MODELS = [f"addk_{k}" for k in range(1, 7)]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_churn_loses_no_request_and_holds_the_cap(workers, workers_repo, tmp_path):
    with start_serve(tmp_path, workers_repo, "--workers", str(workers), "--local-nodes", "1",
                     "--max-models-per-node", str(CAP)) as serve:
        assert len(worker_pids(serve.pid)) == (workers if workers > 1 else 0)
        node = json.loads((serve.state_dir / "node0.ports.json").read_text())
        with StatusSampler(f"127.0.0.1:{node['grpc']}", MODELS) as sampler:
            with Traffic(serve.grpc_target, serve.rest_url, MODELS, clients=16, timeout=120.0) as traffic:
                traffic_runs(serve.process, DURATION_S, lambda: len(sampler.samples) >= 20)
        assert serve.process.poll() is None
        traffic.check()
        assert {r[0] for r in traffic.results} == set(MODELS)
        assert len(sampler.samples) >= 20, len(sampler.samples)
        assert sampler.peak <= CAP, [s for s in sampler.samples if len(s) > CAP][:5]
        assert len(set().union(*sampler.samples)) > CAP  # the node really churned
        if workers > 1:
            assert len(worker_pids(serve.pid)) == workers  # none died under the churn
            log = serve.log_text()  # the warm path was taken, and delegations were revoked before evictions
            assert "delegated model addk_" in log and "revoking model addk_" in log
        print(f"workers={workers}: {len(traffic.results)} requests, {len(sampler.samples)} samples")
