"""Timing the paths: p50/p99 at c=1 (blocks alternating over the paths, gRPC or REST), req/s at a
concurrency from client processes with each process group's CPU per request (a path's meter,
benchlib.cpu), and the first request for a model not resident (cold_rounds)."""

from __future__ import annotations

import asyncio
import http.client
import multiprocessing
import statistics
import time
from collections.abc import Callable

import grpc

from benchlib.cpu import Meter


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- latency at c=1 --------------------------------------------------------------------------

def alternate(calls: dict[str, Callable[[], object]], n: int, block: int = 50) -> dict[str, list[float]]:
    """Blocks of ``block`` calls, path after path, so drift hits every path alike; seconds per call."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(max(1, n // block)):
        for label, call in calls.items():
            for _ in range(block):
                t = time.perf_counter()
                call()
                samples[label].append(time.perf_counter() - t)
    return samples


def grpc_calls(targets: dict[str, str], request: bytes, method: str,
               check: Callable[[bytes], object] | None = None) -> tuple[dict, list]:
    """One warm unary call per path over a raw channel (``check`` sees the first answer; later
    answers must be the same bytes); each call made 50 times first."""
    calls, channels = {}, []
    for label, target in targets.items():
        channel = grpc.insecure_channel(target)
        channels.append(channel)
        stub = channel.unary_unary(method)
        good = stub(request, timeout=120)
        if check is not None:
            check(good)

        def call(stub=stub, good=good, label=label):
            if stub(request, timeout=60) != good:
                raise SystemExit(f"a different answer on {label}")

        for _ in range(50):  # warm: connections, caches, routes
            call()
        calls[label] = call
    return calls, channels


def rest_latency(targets: dict[str, str], path: str, body: bytes, n: int,
                 check: Callable[[bytes], object]) -> dict[str, dict[str, float]]:
    """p50/p99 of ``POST path`` at c=1 on each ``host:port``, keep-alive connections (http.client:
    the cheapest Python client), blocks alternating; every answer 200 and ``check``ed once."""
    connections = {label: http.client.HTTPConnection(*target.rsplit(":", 1)) for label, target in targets.items()}
    headers = {"Content-Type": "application/json"}

    def caller(label: str):
        connection = connections[label]

        def call() -> bytes:
            connection.request("POST", path, body, headers)
            answer = connection.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise SystemExit(f"REST {path} on {label}: {answer.status} {data[:300]!r}")
            return data
        return call

    calls = {label: caller(label) for label in targets}
    for call in calls.values():
        check(call())
        for _ in range(50):
            call()
    s = alternate(calls, n)
    for connection in connections.values():
        connection.close()
    return {label: {"p50_ms": pct(v, 50) * 1e3, "p99_ms": pct(v, 99) * 1e3} for label, v in s.items()}


# -- throughput from client processes --------------------------------------------------------

async def _client(target: str, request: bytes, concurrency: int, seconds: float, method: str, barrier) -> int:
    """``concurrency`` callers back to back on one channel for ``seconds``, once every client
    process is connected and warm (``barrier``, which the parent passes too)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for _ in range(10):
            await call(request, timeout=60)
        await asyncio.to_thread(barrier.wait, 300)
        done = 0
        stop_at = time.monotonic() + seconds

        async def caller():
            nonlocal done
            while time.monotonic() < stop_at:
                await call(request, timeout=60)
                done += 1

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return done


def _client_process(args: tuple, barrier, results) -> None:
    results.put(asyncio.run(_client(*args, barrier)))


def throughput(target: str, request: bytes, concurrency: int, seconds: float, processes: int,
               method: str, meter: Meter | None = None) -> tuple[float, dict[str, float]]:
    """Requests per second with ``concurrency`` calls in flight, spread over ``processes`` client
    processes (so the client is not one Python core); and what ``meter`` counted over the timed
    window."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    clients = [context.Process(target=_client_process, args=((target, request, share, seconds, method),
                                                             barrier, results), daemon=True)
               for share in shares]
    for client in clients:
        client.start()
    try:
        barrier.wait(300)  # every client connected and warm: the clock starts
        before = meter() if meter else {}
        time.sleep(seconds)
        after = meter() if meter else {}
        done = sum(results.get(timeout=120) for _ in clients)
    finally:
        for client in clients:
            client.join(30)
            if client.is_alive():
                client.kill()
    return done / seconds, {who: after[who] - before.get(who, 0.0) for who in after}


# -- one model, every path -------------------------------------------------------------------

def bench_warm(model: str, request: bytes, targets: dict[str, str], meters: dict[str, Meter], n: int,
               seconds: float, concurrencies: tuple[int, ...], processes: int, method: str,
               check: Callable[[bytes], object] | None = None) -> dict:
    """p50/p99 at c=1 on every path (alternating blocks), then at each concurrency req/s, the ratio
    to direct, and CPU µs per request of each process group (``cpu_us_c{c}``; ``proxy_cpu_us_c{c}``
    is every group but the node; ``routed_share_c{c}``: what HAProxy routed of the requests)."""
    calls, channels = grpc_calls(targets, request, method, check)
    s = alternate(calls, n)
    for channel in channels:
        channel.close()
    result = {"model": model, "requests_c1": len(s["direct"]), "concurrencies": list(concurrencies), "paths": {}}
    for label in targets:
        result["paths"][label] = {"target": targets[label], "p50_ms": pct(s[label], 50) * 1e3,
                                  "p99_ms": pct(s[label], 99) * 1e3, "mean_ms": statistics.fmean(s[label]) * 1e3}
        result["paths"][label]["added_p50_ms"] = result["paths"][label]["p50_ms"] - pct(s["direct"], 50) * 1e3
    for c in concurrencies:
        for label, target in targets.items():
            rps, used = throughput(target, request, c, seconds, processes, method, meters.get(label))
            path, done = result["paths"][label], max(1.0, rps * seconds)
            path[f"rps_c{c}"] = rps
            path[f"cpu_us_c{c}"] = {who: v / done * 1e6 for who, v in used.items() if who != "routed"}
            path[f"node_cpu_us_c{c}"] = path[f"cpu_us_c{c}"].get("node", float("nan"))
            if label != "direct":
                path[f"proxy_cpu_us_c{c}"] = sum(v for who, v in path[f"cpu_us_c{c}"].items() if who != "node")
            if "routed" in used:
                path[f"routed_share_c{c}"] = used["routed"] / done
        for path in result["paths"].values():
            path[f"ratio_c{c}"] = path[f"rps_c{c}"] / result["paths"]["direct"][f"rps_c{c}"]
    return result


def cold_rounds(names: list[str], firsts: dict[str, Callable[[str], None]],
                resets: dict[str, Callable[[str], None]]) -> dict:
    """The first request for a model not resident, on each path: ``firsts[label](name)`` is timed,
    then ``resets[label](name)`` unloads it. Each round takes a fresh model per path and the
    paths' order turns every round; the first name is a warm-up on every path, not counted.
    Medians, and the median of each path's per-round difference to the first path."""
    labels = list(firsts)
    for label in labels:  # warm-up: connections, the node's first load, page cache
        firsts[label](names[0])
        resets[label](names[0])
    times: dict[str, list[float]] = {label: [] for label in labels}
    rest = names[1:]
    rounds = len(rest) // len(labels)
    for i in range(rounds):
        order = labels[i % len(labels):] + labels[:i % len(labels)]
        for j, label in enumerate(order):
            name = rest[i * len(labels) + j]
            t = time.perf_counter()
            firsts[label](name)
            times[label].append(time.perf_counter() - t)
            resets[label](name)
    base = labels[0]
    out = {"rounds": rounds, "base": base, "paths": {}}
    for label in labels:
        diffs = [a - b for a, b in zip(times[label], times[base])]
        out["paths"][label] = {"median_ms": 1e3 * statistics.median(times[label]),
                               "added_median_vs_base_ms": 1e3 * statistics.median(diffs),
                               "all_ms": [round(1e3 * t, 1) for t in times[label]]}
    return out
