#!/usr/bin/env python
"""Co-access prefetch live: a pipeline replayed against ``tfscache serve``, prefetch off and on (issue 25).

    .venv/bin/python scripts/bench_prefetch.py [--backend tfserving|triton] [--models 16] [--cap 6]
        [--rounds 150] [--gap-ms 0]

Builds N ``addk`` models (``--size-mb`` each, so a load takes measurable time; with ``--backend
triton`` python-backend models whose ``initialize()`` allocates that much, on a real tritonserver,
asked with tritonclient.grpc) and a pipeline
workload: each round picks a model A by Zipf rank (alpha 1, fixed seed) and predicts it; with
probability 0.5 the round then predicts A's fixed follower B, ``--gap-ms`` after A's answer (0: at
once, as a two-stage inference does). The same rounds run against two ``tfscache serve`` processes
in turn, each with one node child (``tfscache node``, or tritonserver) capped at ``--cap`` models (LRU): the baseline with
``cache.prefetch=false``, then ``cache.prefetch=true`` (its defaults otherwise), ``--repeats`` times. Per run, from the
request log's ``cold`` column (the request waited for a load) and the client's clock: cold
requests, cold follower requests, follower requests served by a prefetched load, and the total
wait (client seconds of the cold requests), plus the prefetch counts from /status. Prints
Markdown. Loopback only; both serves are stopped on exit.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import grpc  # noqa: E402
import requests  # noqa: E402
from support.serving import link_repository, start_serve  # noqa: E402
from support.requests import predict_request  # noqa: E402
from tensorflow_serving.apis import prediction_service_pb2_grpc  # noqa: E402


_RUNS = itertools.count(1)


def build(root: Path, count: int, size_bytes: int, backend: str) -> Path:
    if backend == "triton":
        from support.models.triton import build_triton_models  # noqa: PLC0415

        build_triton_models(root / "models", synthetic=count, padding_bytes=size_bytes)
        return root / "models"
    from support.models import tfserving as testmodels  # noqa: PLC0415 (tensorflow: only here)

    bases = [testmodels.build_addk(root / f"built{k}", k, size_bytes, (1,)) for k in range(1, count + 1)]
    return link_repository(root / "models", bases)


def client(backend: str, target: str):
    """(a function predicting model ``name`` once, what closes it): the backend's official client."""
    if backend == "triton":
        import numpy as np  # noqa: PLC0415
        import tritonclient.grpc as tritongrpc  # noqa: PLC0415

        triton = tritongrpc.InferenceServerClient(target)

        def infer(name: str) -> None:
            tensor = tritongrpc.InferInput("x", [1], "FP32")
            tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
            triton.infer(name, [tensor], client_timeout=300)

        return infer, triton.close
    channel = grpc.insecure_channel(target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return (lambda name: stub.Predict(predict_request(name, 1.0), timeout=300)), channel.close


def rounds(count: int, n: int, seed: int = 1) -> list[tuple[int, int | None]]:
    """(A's k, B's k or None) per round: Zipf(1) over the models, each with one fixed follower."""
    rng = random.Random(seed)
    ks = list(range(1, count + 1))
    follower = dict(zip(ks, rng.sample(ks, count)))
    weights = [1.0 / rank for rank in range(1, count + 1)]
    out = []
    for a in rng.choices(ks, weights, k=n):
        b = follower[a] if follower[a] != a and rng.random() < 0.5 else None
        out.append((a, b))
    return out


def run(repo: Path, tmp: Path, plan: list[tuple[int, int | None]], cap: int, gap_s: float, prefetch: bool,
        backend: str) -> dict:
    log = tmp / f"requests-{next(_RUNS)}.csv"
    with start_serve(tmp, repo, "--backend", backend, "--local-nodes", "1", "--max-models-per-node", str(cap),
                     "--metrics-port", "0", "--request-log", str(log), "--set", "cache.policy=lru",
                     "--set", f"cache.prefetch={'true' if prefetch else 'false'}") as serve:
        metrics_port = json.loads((serve.directory / "ports.json").read_text())["metrics"]
        seconds, follower = [], []
        infer, close = client(backend, serve.grpc_target)
        try:
            started = time.perf_counter()
            for a, b in plan:
                for k, is_follower in ((a, False), (b, True)):
                    if k is None:
                        continue
                    if is_follower and gap_s:
                        time.sleep(gap_s)  # the pipeline's own pace between stages, not a wait for the cache
                    t0 = time.perf_counter()
                    infer(f"addk_{k}")
                    seconds.append(time.perf_counter() - t0)
                    follower.append(is_follower)
            wall = time.perf_counter() - started
        finally:
            close()
        node = requests.get(f"http://127.0.0.1:{metrics_port}/status", timeout=10).json()["nodes"][0]
        deadline = time.monotonic() + 30
        while len(_rows(log)) < len(seconds) and time.monotonic() < deadline:
            time.sleep(0.1)
    rows = _rows(log)
    cold = [r["cold"] == "1" for r in rows]
    return {"prefetch": prefetch, "requests": len(rows), "followers": sum(follower),
            "cold": sum(cold), "cold_followers": sum(c and f for c, f in zip(cold, follower)),
            "prefetched_followers": sum(r["prefetched"] == "1" and f for r, f in zip(rows, follower)),
            "wait_s": sum(s for s, c in zip(seconds, cold) if c), "wall_s": wall,
            "counts": node["prefetch"] or {}}


def _rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("tfserving", "triton"), default="tfserving")
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--cap", type=int, default=6, help="models per node (default 6)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--size-mb", type=float, default=20.0, help="each model's variable (default 20 MB)")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between a pipeline's stages (default 0)")
    parser.add_argument("--repeats", type=int, default=1, help="off-then-on pairs, alternating (default 1)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-prefetch-") as tmp:
        tmp = Path(tmp)
        repo = build(tmp, args.models, int(args.size_mb * 1e6), args.backend)
        plan = rounds(args.models, args.rounds)
        results = [run(repo, tmp, plan, args.cap, args.gap_ms / 1000, on, args.backend)
                   for _ in range(args.repeats) for on in (False, True)]
    print(f"{args.backend}: {args.rounds} rounds, {args.models} models of {args.size_mb:g} MB, cap {args.cap} (LRU), "
          f"gap {args.gap_ms:g} ms between stages\n")
    print("| prefetch | requests | cold | follower requests | cold followers | followers served by a prefetch "
          "| total wait (s) | wall (s) | prefetch started / completed / used / wasted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r["counts"]
        counts = f"{c.get('started', 0)} / {c.get('completed', 0)} / {c.get('used', 0)} / {c.get('wasted', 0)}" \
            if r["prefetch"] else "-"
        print(f"| {'on' if r['prefetch'] else 'off'} | {r['requests']} | {r['cold']} | {r['followers']} | "
              f"{r['cold_followers']} | {r['prefetched_followers']} | {r['wait_s']:.2f} | {r['wall_s']:.1f} | "
              f"{counts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
