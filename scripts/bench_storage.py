#!/usr/bin/env python
"""Cold requests from a bucket, from the disk tier, from a local path and from a tier on /dev/shm.

    .venv/bin/python scripts/bench_storage.py [--sizes 50,200] [--rounds 7] [--json F]

One moto S3 server (its own process) holds addk models of about 50 MB and 200 MB (a padding
variable; ``support.models.tfserving``). Every figure is the wall time of one REST predict
of a model that is not on the node (plain HTTP, a fresh request each time):

* s3 cold: ``tfscache serve --model-repository s3://...`` with an empty disk tier on disk:
  list + download + load (a new serve and tier for each round);
* tier hit: the same serve after ``evict`` (admin API): the version is in the tier, load only;
* local path: ``tfscache serve --model-repository DIR`` over the same SavedModels, after ``evict``;
* shm cold / shm hit: as the first two with ``--disk-cache-dir /dev/shm/...``.

Download throughput: tfscache's (``tfscache_downloaded_bytes_total`` over
``tfscache_download_duration_seconds_sum``, from /metrics), into the disk tier and into the
/dev/shm tier, against obstore's own concurrent download of the same objects (8 in flight,
``get_async`` streamed to files; tests/storage/bench_download.py), one version at a time as
the tier fetches them here, in the same run: onto disk,
onto disk followed by an fsync of every file (the tier makes each version durable before its
marker), and onto /dev/shm.

Prints Markdown (medians, and each round) for docs/BENCHMARKS.md. Loopback only; every
process it starts is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable

from storage.bench_download import with_obstore  # noqa: E402 (obstore's own bulk download)
from support.s3 import MotoServer  # noqa: E402
from tfscache.admin.client import AdminClient  # noqa: E402

BUCKET = "bench"
POLL_S = 0.1  # node.file_system_poll_wait_seconds (its default)
JITTER = random.Random(7)


def build_models(root: Path, sizes_mb: list[int]) -> dict[str, Path]:
    from support.models import tfserving as testmodels  # noqa: PLC0415 (tensorflow: only here)

    return {f"addk_{mb}": testmodels.build_addk(root, mb, size_bytes=mb * 1_000_000) for mb in sizes_mb}


def upload(server: MotoServer, models: dict[str, Path]) -> None:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for name, base in models.items():
        for path in base.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"models/{name}/{path.relative_to(base).as_posix()}")
    client.close()


class Serve:
    """One ``tfscache serve`` (one embedded node) on free ports, with an admin port."""

    def __init__(self, work: Path, repository: str, env: dict[str, str], *extra: str) -> None:
        self.dir = Path(tempfile.mkdtemp(dir=work))
        ports = self.dir / "ports.json"
        self.log = open(self.dir / "serve.log", "wb")
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tfscache", "serve", "--model-repository", repository, "--grpc-port", "0",
             "--rest-port", "0", "--admin-port", "0", "--metrics-port", "0", "--bind-address", "127.0.0.1",
             "--ports-file", str(ports), "--set", f"node.state_dir={self.dir / 'state'}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **env})
        deadline = time.monotonic() + 180
        while not ports.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.dir / "serve.log").read_text()[-3000:])
            time.sleep(0.1)  # polling for the ports file, with a deadline
        self.ports = json.loads(ports.read_text())

    def predict(self, name: str) -> float:
        """Seconds for one REST predict of ``name`` (checked: y = x + k).

        A new model is loaded at the node's next file-system poll (TF Serving's behaviour;
        ``node.file_system_poll_wait_seconds`` = 0.1 s), so a loop of evict-then-predict
        lands at one phase of that poll every time: each request first waits a random
        0..0.1 s, so every case samples the poll's phase alike."""
        time.sleep(JITTER.uniform(0.0, POLL_S))
        body = json.dumps({"instances": [1.0]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports['rest']}/v1/models/{name}:predict",
                                         data=body, headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as reply:
            predictions = json.loads(reply.read())["predictions"]
        seconds = time.perf_counter() - started
        assert predictions == [1.0 + int(name.split("_")[1])], predictions
        return seconds

    def evict(self, name: str) -> None:
        with AdminClient(f"127.0.0.1:{self.ports['admin']}") as admin:
            admin.evict(name)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,200", help="model sizes in MB, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: dict[str, dict[str, list[float]]] = {}

    def record(case: str, name: str, seconds: float) -> None:
        figures.setdefault(case, {}).setdefault(name, []).append(seconds)

    with tempfile.TemporaryDirectory() as tmp, MotoServer(Path(tmp) / "moto") as server:
        work = Path(tmp)
        models = build_models(work / "models", sizes)
        upload(server, models)
        env = {**server.env}
        url = f"s3://{BUCKET}/models"
        throughput: dict[str, list[float]] = {}
        for tier_root, cold, hit in ((work, "s3 cold", "tier hit"), (Path("/dev/shm"), "shm cold", "shm hit")):
            for _ in range(args.rounds):
                tier = Path(tempfile.mkdtemp(dir=tier_root, prefix="tfscache-bench-tier-"))
                serve = Serve(work, url, env, "--disk-cache-dir", str(tier), "--disk-cache-bytes", "4GiB")
                try:
                    for name in models:
                        record(cold, name, serve.predict(name))
                        serve.evict(name)
                        record(hit, name, serve.predict(name))
                        serve.evict(name)
                    throughput.setdefault(cold, []).append(serve.metric("tfscache_downloaded_bytes_total")
                                                          / serve.metric("tfscache_download_duration_seconds_sum"))
                finally:
                    serve.stop()
                    shutil.rmtree(tier, ignore_errors=True)
        local = Serve(work, str(work / "models"), {})
        try:
            for name in models:
                local.predict(name)  # the first load also warms the page cache, as the tier's hits are
                local.evict(name)
                for _ in range(args.rounds):
                    record("local path", name, local.predict(name))
                    local.evict(name)
        finally:
            local.stop()
        bulk: dict[str, list[float]] = {}
        for i in range(args.rounds):
            for where, root in (("disk", work), ("disk+fsync", work), ("shm", Path("/dev/shm"))):
                size = seconds = 0.0
                for name in models:  # one version at a time, as the tier downloads them here
                    dest = Path(tempfile.mkdtemp(dir=root, prefix="tfscache-bench-bulk-"))
                    started = time.perf_counter()
                    size += asyncio.run(with_obstore(server, dest, BUCKET, f"models/{name}/"))
                    if where == "disk+fsync":  # what the tier does before its marker: every file on disk
                        for path in dest.rglob("*"):
                            if path.is_file():
                                fd = os.open(path, os.O_RDONLY)
                                os.fsync(fd)
                                os.close(fd)
                    seconds += time.perf_counter() - started
                    shutil.rmtree(dest)
                bulk.setdefault(where, []).append(size / seconds)

    cpu = os.cpu_count()
    print(f"machine: {cpu} cores; models of {', '.join(f'{s} MB' for s in sizes)}; {args.rounds} rounds; "
          f"moto server on 127.0.0.1\n")
    print("| case | " + " | ".join(f"{name} median s (rounds)" for name in models) + " |")
    print("|---|" + "---|" * len(models))
    for case in ("s3 cold", "tier hit", "local path", "shm cold", "shm hit"):
        cells = [f"{statistics.median(figures[case][n]):.3f} ({', '.join(f'{v:.2f}' for v in figures[case][n])})"
                 for n in models]
        print(f"| {case} | " + " | ".join(cells) + " |")
    print()
    for name in models:
        local_s = statistics.median(figures["local path"][name])
        print(f"{name}: tier hit / local path = {statistics.median(figures['tier hit'][name]) / local_s:.2f}; "
              f"shm hit / local path = {statistics.median(figures['shm hit'][name]) / local_s:.2f}; "
              f"s3 cold / local path = {statistics.median(figures['s3 cold'][name]) / local_s:.2f}")
    mib = 1 << 20

    def rates(values: list[float]) -> str:
        return f"{statistics.median(values) / mib:.0f} MiB/s (rounds: {', '.join(f'{v / mib:.0f}' for v in values)})"

    print("\ndownload throughput (median of rounds):")
    print(f"  tfscache into a disk tier:      {rates(throughput['s3 cold'])}")
    print(f"  tfscache into a /dev/shm tier:  {rates(throughput['shm cold'])}")
    for where, values in bulk.items():
        print(f"  obstore bulk, {where + ':':<17}{rates(values)}")
    disk, shm = statistics.median(throughput["s3 cold"]), statistics.median(throughput["shm cold"])
    print(f"  ratios: disk tier / bulk on disk {disk / statistics.median(bulk['disk']):.2f}; disk tier / bulk on "
          f"disk + fsync {disk / statistics.median(bulk['disk+fsync']):.2f}; shm tier / bulk on shm "
          f"{shm / statistics.median(bulk['shm']):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "throughput": throughput, "bulk": bulk}))


if __name__ == "__main__":
    main()
