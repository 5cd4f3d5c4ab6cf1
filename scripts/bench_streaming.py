#!/usr/bin/env python
"""Benchmark: ModelStreamInfer and generate_stream through `tfscache serve --backend triton` versus
straight to the node, same run (issue 24).

    .venv/bin/python scripts/bench_streaming.py [--rounds 200] [--responses 20] [--delay-ms 0]

Builds one decoupled python-backend model (tests/support/models/triton.py ``build_stream``:
K responses per request, ``--delay-ms`` apart), starts ``tfscache serve --backend triton
--local-nodes 1`` (scripts/bench_triton.py's ``start_serve``) and reads its node's ports, so both
paths reach the same tritonserver and the same loaded model. Then, in alternating rounds:

* gRPC: one ModelStreamInfer call per round carrying one request (tritonclient.grpc's
  ModelInferRequest, serialized once, on a raw grpc channel), read to its end: time to the
  first response, and the mean gap between responses (the last minus the first, over K - 1);
* REST: ``POST .../generate_stream`` with aiohttp, read to its end: time to the first chunk.

Prints medians and p99 of each path and the differences (tfscache minus direct).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import InferInput, service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_triton import REPO, machine, pct, start_serve, stop  # noqa: E402

sys.path[:0] = [str(REPO), str(REPO / "tests")]
from support.models import triton as testmodels  # noqa: E402

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def request_bytes(name: str) -> bytes:
    x = InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    request = service_pb2.ModelInferRequest(model_name=name, inputs=[x._get_tensor()])
    request.raw_input_contents.append(x._get_content())
    return request.SerializeToString()


async def grpc_round(call, request: bytes, k: int) -> tuple[float, float]:
    started = time.perf_counter()
    times = []
    async for response in call(request, timeout=60):
        parsed = service_pb2.ModelStreamInferResponse.FromString(response)
        assert not parsed.error_message, parsed.error_message
        times.append(time.perf_counter())
    assert len(times) == k, len(times)
    return times[0] - started, (times[-1] - times[0]) / (k - 1)


async def rest_round(http: aiohttp.ClientSession, url: str, k: int) -> float:
    started = time.perf_counter()
    async with http.post(url, json={"x": [2.0]}) as reply:
        first = None
        body = b""
        async for chunk in reply.content.iter_any():
            first = first or time.perf_counter()
            body += chunk
    assert reply.status == 200 and body.count(b"data: ") == k, (reply.status, body[:200])
    return first - started


def summary(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} / {pct(values, 99) * 1000:.2f}"


async def run(args, node: dict, ports: dict) -> None:
    targets = {"direct": f"127.0.0.1:{node['grpc']}", "tfscache": f"127.0.0.1:{ports['grpc']}"}
    urls = {"direct": f"http://127.0.0.1:{node['rest']}", "tfscache": f"http://127.0.0.1:{ports['rest']}"}
    channels = {p: grpc.aio.insecure_channel(t) for p, t in targets.items()}
    calls = {p: c.unary_stream(STREAM) for p, c in channels.items()}
    request = request_bytes("stream")
    figures = {p: {"ttfr": [], "gap": [], "rest": []} for p in targets}
    async with aiohttp.ClientSession() as http:
        for path in ("tfscache", "direct"):  # warm-up (tfscache first: it loads the model)
            for _ in range(5):
                await grpc_round(calls[path], request, args.responses)
                await rest_round(http, f"{urls[path]}/v2/models/stream/generate_stream", args.responses)
        for n in range(args.rounds):
            for path in (("direct", "tfscache") if n % 2 else ("tfscache", "direct")):
                first, gap = await grpc_round(calls[path], request, args.responses)
                figures[path]["ttfr"].append(first)
                figures[path]["gap"].append(gap)
                figures[path]["rest"].append(
                    await rest_round(http, f"{urls[path]}/v2/models/stream/generate_stream", args.responses))
    for channel in channels.values():
        await channel.close()
    print(f"{args.rounds} rounds per path, K = {args.responses} responses per request, "
          f"{args.delay_ms} ms apart; {machine()}\n")
    print("| path | gRPC time to first response, ms (p50 / p99) | gRPC gap between responses, ms (p50 / p99) "
          "| REST generate_stream time to first chunk, ms (p50 / p99) |")
    print("|---|---|---|---|")
    for path, f in figures.items():
        print(f"| {path} | {summary(f['ttfr'])} | {summary(f['gap'])} | {summary(f['rest'])} |")
    d, t = figures["direct"], figures["tfscache"]
    print(f"| added by tfscache (p50) | {(statistics.median(t['ttfr']) - statistics.median(d['ttfr'])) * 1000:.2f} "
          f"| {(statistics.median(t['gap']) - statistics.median(d['gap'])) * 1000:.3f} "
          f"| {(statistics.median(t['rest']) - statistics.median(d['rest'])) * 1000:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--responses", type=int, default=20)
    parser.add_argument("--delay-ms", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        repo = Path(tmp) / "repo"
        testmodels.build_stream(repo, args.responses, args.delay_ms, name="stream")
        process, ports, node = start_serve(repo, Path(tmp))
        try:
            asyncio.run(run(args, node, ports))
        finally:
            stop(process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
