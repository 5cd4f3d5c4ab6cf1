#!/usr/bin/env python
"""Benchmark the per-node CacheManager against a real ``tfscache node``.

    .venv/bin/python scripts/bench_cache.py [--rounds 15] [--size-mb 1] [--poll 0.01] [--hits 200000]

1. Cold-request overhead: for each of --rounds models, load it once straight through
   HandleReloadConfigRequest (the baseline: the RPC returns once the model is AVAILABLE)
   and once through ``CacheManager.acquire`` (which also checks the repository, measures
   the directory, confirms with GetModelStatus and writes its state file), in
   alternating order, unloading and waiting for END in between. Medians of both and of
   the per-round difference.
2. 16 distinct cold models requested at once (16 concurrent acquires) versus one after
   another, from an empty node; medians over --repeats.
3. Acquire/release on a hit, in microseconds (median of 5 batches).

This process never imports tensorflow: the models are built by scripts/make_models.py
in a child process. Prints Markdown (docs/BENCHMARKS.md holds a run); --json F
writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.tfserving.adapter import TFServingAdapter
from tfscache.cache.manager import CacheManager  # noqa: E402
from tfscache.settings import CacheSection  # noqa: E402
from tfscache.kinds.tfserving.client import END, NodeClient  # noqa: E402
from tfscache.repository.local import ModelRepository  # noqa: E402
from tfscache.wire import serving_pb2 as pb  # noqa: E402
from benchlib.report import machine  # noqa: E402  (scripts/ is the script's own directory)


def start_node(workdir: Path, poll: float) -> tuple[subprocess.Popen, dict]:
    ports, log, config = workdir / "ports.json", workdir / "node.log", workdir / "models.config"
    config.write_text("model_config_list {}\n")
    command = [sys.executable, "-m", "tfscache", "node", "--port=0", "--rest_api_port=0",
               "--bind_address=127.0.0.1", f"--ports_file={ports}", f"--model_config_file={config}",
               f"--file_system_poll_wait_seconds={poll}", "--num_load_threads=4", "--max_num_load_retries=0"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    while not ports.exists():
        if process.poll() is not None:
            raise SystemExit(f"node exited: {log.read_text()[-3000:]}")
        time.sleep(0.05)
    return process, json.loads(ports.read_text())


def config_of(repository: ModelRepository, names: list[str]) -> pb.ModelServerConfig:
    config = pb.ModelServerConfig()
    config.model_config_list.SetInParent()
    for name in names:
        entry = config.model_config_list.config.add(
            name=name, base_path=str(repository.base_path(name)), model_platform="tensorflow")
        entry.model_version_policy.specific.versions.append(1)
    return config


async def until_end(client: NodeClient, names: list[str]) -> None:
    """Wait until every model is END (or unknown) on the node."""
    for name in names:
        while True:
            statuses = await client.status(name)
            if all(s.state == END for s in statuses):
                break
            await asyncio.sleep(0.005)


async def fresh_cache(client: NodeClient, repository: ModelRepository, pid: int, names: list[str],
                      **settings) -> CacheManager:
    """A started cache on an emptied node (start() clears it; wait for the unloads)."""
    cache = CacheManager(TFServingAdapter(client, repository, memory=NodeMemory(pid)), repository, CacheSection(**settings),
                         state_file=Path(tempfile.mkdtemp()) / "state.json")
    await cache.start()
    await until_end(client, names)
    return cache


async def bench_cold(client, repository, pid, names) -> dict:
    direct, cached, diffs = [], [], []
    for i, name in enumerate(names):
        times = {}
        for method in (("direct", "cache") if i % 2 == 0 else ("cache", "direct")):
            cache = await fresh_cache(client, repository, pid, names)
            t0 = time.perf_counter()
            if method == "direct":
                await client.reload(config_of(repository, [name]), deadline_s=300)
            else:
                (await cache.acquire(name)).release()
            times[method] = time.perf_counter() - t0
            await cache.stop()
        direct.append(times["direct"])
        cached.append(times["cache"])
        diffs.append(times["cache"] - times["direct"])
    await (await fresh_cache(client, repository, pid, names)).stop()
    return {"rounds": len(names), "direct_ms": 1e3 * statistics.median(direct),
            "cache_ms": 1e3 * statistics.median(cached), "overhead_ms": 1e3 * statistics.median(diffs),
            "overhead_p90_ms": 1e3 * sorted(diffs)[int(0.9 * (len(diffs) - 1))]}


class CountingClient(NodeClient):
    """Counts the reloads that add models."""

    loads = 0

    async def reload(self, config, deadline_s=None):
        before = getattr(self, "_last", set())
        self._last = {m.name for m in config.model_config_list.config}
        self.loads += bool(self._last - before)
        await super().reload(config, deadline_s)


async def bench_16(client, repository, pid, names, repeats: int) -> dict:
    together, serial, reloads = [], [], []
    for r in range(repeats):
        for method in (("together", "serial") if r % 2 == 0 else ("serial", "together")):
            cache = await fresh_cache(client, repository, pid, names)
            loads_before = client.loads
            t0 = time.perf_counter()
            if method == "together":
                leases = await asyncio.gather(*(cache.acquire(n) for n in names))
            else:
                leases = [await cache.acquire(n) for n in names]
            elapsed = time.perf_counter() - t0
            for lease in leases:
                lease.release()
            (together if method == "together" else serial).append(elapsed)
            if method == "together":
                reloads.append(client.loads - loads_before)
            await cache.stop()
    await (await fresh_cache(client, repository, pid, names)).stop()
    return {"models": len(names), "repeats": repeats, "together_s": statistics.median(together),
            "serial_s": statistics.median(serial), "together_reloads": statistics.median(reloads)}


async def bench_hits(client, repository, pid, names, hits: int) -> dict:
    cache = await fresh_cache(client, repository, pid, names)
    (await cache.acquire(names[0])).release()
    results = {}
    for label, version in (("latest", None), ("specific", 1)):
        batches = []
        for _ in range(5):
            n = hits // 5
            t0 = time.perf_counter()
            for _ in range(n):
                lease = await cache.acquire(names[0], version)
                lease.release()
            batches.append((time.perf_counter() - t0) / n)
        results[f"{label}_us"] = 1e6 * statistics.median(batches)
    await cache.stop()
    return results


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    models = workdir / "models"
    count = max(16, args.rounds)
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_models.py"), str(models), "--synthetic",
                    str(count), "--size-mb", str(args.size_mb), "--no-test-models"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process, ports = start_node(workdir, args.poll)
    client = CountingClient(f"127.0.0.1:{ports['grpc']}", rpc_deadline_s=30)
    repository = ModelRepository(models)
    names = [f"addk_{k}" for k in range(1, count + 1)]
    try:
        figures = {"machine": machine(), "size_mb": args.size_mb, "poll_s": args.poll}
        # Warm-up: the node's first load pays TF's one-time set-up; the page cache fills.
        cache = await fresh_cache(client, repository, ports["pid"], names)
        for name in names:
            (await cache.acquire(name)).release()
        await cache.stop()
        figures["cold"] = await bench_cold(client, repository, ports["pid"], names[:args.rounds])
        figures["sixteen"] = await bench_16(client, repository, ports["pid"], names[:16], args.repeats)
        figures["hit"] = await bench_hits(client, repository, ports["pid"], names, args.hits)
        return figures
    finally:
        await client.close()
        process.terminate()
        process.wait(30)


def markdown(f: dict) -> str:
    c, s, h = f["cold"], f["sixteen"], f["hit"]
    return "\n".join([
        f"Machine: {f['machine']}. Models: addk_k of {f['size_mb']} MB; node polls every {f['poll_s']} s.",
        "",
        "| cold request (median of %d) | ms |" % c["rounds"],
        "|---|---|",
        f"| direct HandleReloadConfigRequest (baseline) | {c['direct_ms']:.1f} |",
        f"| CacheManager.acquire | {c['cache_ms']:.1f} |",
        f"| added by the cache (median of per-round differences) | {c['overhead_ms']:.1f} |",
        f"| added by the cache, p90 | {c['overhead_p90_ms']:.1f} |",
        "",
        f"| 16 distinct cold models (median of {s['repeats']}) | s |",
        "|---|---|",
        f"| at once (16 concurrent acquires; {s['together_reloads']:.0f} loading reloads) | {s['together_s']:.2f} |",
        f"| one after another | {s['serial_s']:.2f} |",
        "",
        "| acquire + release on a hit | µs |",
        "|---|---|",
        f"| latest version (`acquire(name)`) | {h['latest_us']:.1f} |",
        f"| specific version (`acquire(name, 1)`) | {h['specific_us']:.1f} |",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="cold-request rounds (models)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the 16-model test")
    parser.add_argument("--size-mb", type=float, default=1.0, help="size of each synthetic model")
    parser.add_argument("--poll", type=float, default=0.01, help="node's --file_system_poll_wait_seconds")
    parser.add_argument("--hits", type=int, default=200_000, help="acquire/release pairs on a hit")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args))
    print(markdown(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
