"""Download throughput of the candidate libraries against a moto server (docs/storage.md).

    .venv/bin/python tests/storage/bench_download.py [--runs 3]

One ~50 MiB version (a 32 MiB object and 18 of 1 MiB) in one bucket; each library
downloads the whole prefix into a fresh directory, 8 objects in flight; best of N runs.
Not a test (pytest does not collect it); needs obstore, s3fs and moto[server].
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.s3 import MotoServer  # noqa: E402

BUCKET, PREFIX = "bench", "model/1/"
OBJECTS = {"variables/big.bin": 32 << 20, **{f"assets/part{i:02d}.bin": 1 << 20 for i in range(18)}}


def seed(server: MotoServer) -> int:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for key, size in OBJECTS.items():
        client.put_object(Bucket=BUCKET, Key=PREFIX + key, Body=os.urandom(size))
    client.close()
    return sum(OBJECTS.values())


async def with_obstore(server: MotoServer, dest: Path, bucket: str = BUCKET, prefix: str = PREFIX) -> int:
    """obstore's own concurrent download of every object under ``prefix`` (8 in flight); the bytes."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=server.endpoint, region="us-east-1", access_key_id="testing",
                    secret_access_key="testing", client_options={"allow_http": True})
    listed = [o for batch in obstore.list(store, prefix) for o in batch]
    gate = asyncio.Semaphore(8)

    async def one(path: str) -> None:
        async with gate:
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            result = await obstore.get_async(store, path)
            with open(target, "wb") as out:
                async for chunk in result.stream(min_chunk_size=1 << 20):
                    out.write(chunk)

    await asyncio.gather(*(one(o["path"]) for o in listed))
    return sum(o["size"] for o in listed)


def with_s3fs(server: MotoServer, dest: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", use_listings_cache=False,
                           client_kwargs={"endpoint_url": server.endpoint, "region_name": "us-east-1"})
    fs.get(f"{BUCKET}/{PREFIX}", str(dest) + "/", recursive=True, batch_size=8)


def with_boto3(server: MotoServer, dest: Path) -> None:
    client = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]

    def one(key: str) -> None:
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(target))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, keys))
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, MotoServer(Path(tmp) / "moto") as server:
        total = seed(server)
        candidates = {"obstore": lambda d: asyncio.run(with_obstore(server, d)),
                      "s3fs": lambda d: with_s3fs(server, d), "boto3": lambda d: with_boto3(server, d)}
        for name, run in candidates.items():
            best = float("inf")
            for i in range(args.runs):
                dest = Path(tmp) / f"{name}{i}"
                started = time.perf_counter()
                run(dest)
                best = min(best, time.perf_counter() - started)
                got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
                assert got == total, (name, got, total)
                shutil.rmtree(dest)
            print(f"{name:8s} {total / 2**20:.0f} MiB in {best:.3f} s = {total / 2**20 / best:.0f} MiB/s")


if __name__ == "__main__":
    main()
