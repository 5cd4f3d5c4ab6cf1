"""A GCS emulator (PyPI ``gcp-storage-emulator``) as a test server of its own process.

    from support.gcs import GcsEmulator

    with GcsEmulator(tmp_path).start() as gcs:
        gcs.upload({"half_plus_two/1/saved_model.pb": b"..."})   # into gcs.bucket
        gcs.endpoint           # "http://127.0.0.1:P"
        gcs.env                # {"STORAGE_EMULATOR_HOST": gcs.endpoint, ...}: a client's view
        gcs.client()           # google.cloud.storage.Client on the emulator, anonymous
        gcs.listing("m/1/"), gcs.read("m/1/saved_model.pb")   # {key: size}, bytes
        gcs.kill()             # SIGKILL (a crash); gcs.stop() is SIGTERM
        gcs.start()            # again, on the same port, with the same objects

or adopt the fixture: ``gcs_emulator = support.gcs.gcs_emulator`` (bucket ``models``).

The process is this module run as ``python -m support.gcs``: the emulator's own ``RequestHandler`` and
``Storage`` (what ``gcp-storage-emulator start`` serves) behind an ``HTTPServer`` bound to
127.0.0.1 port 0, or to the port asked for, which writes ``{"port", "pid"}`` to a ports
file once bound: the CLI cannot report a port it picked. Objects live on disk under
``directory/data`` (``.cloudstorage/``), so they survive a stop or a kill and a restart.

Fidelity (docs/storage.md, "Emulators"): JSON API only (the XML API answers 501, so
obstore's GCSStore cannot use it); a list is never paginated; generation preconditions on
reads are not enforced; one request at a time (a plain ``HTTPServer``, HTTP/1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from support.waiting import wait_until

PROJECT = "tfscache-test"
TESTS = Path(__file__).resolve().parents[1]  # the launcher runs as ``python -m support.gcs`` from here


class GcsStartError(RuntimeError):
    """The emulator exited, or did not answer in time; the message carries its log."""


class GcsEmulator:
    """One emulator process: its directory, port (fixed after the first start) and bucket."""

    def __init__(self, directory: Path, bucket: str = "models", start_timeout_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log_path = self.directory / "gcs.log"
        self._ports_file = self.directory / "gcs.ports.json"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What points a client configured only by the environment at this emulator:
        google-cloud-storage and gcsfs read ``STORAGE_EMULATOR_HOST`` (then use no
        credentials); the project is for clients that ask for one."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": PROJECT}

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> GcsEmulator:
        """Launch, on port 0 the first time and on the same port after; return once a GET of
        the bucket answers 200 (the bucket is created if missing)."""
        if self.alive:
            raise RuntimeError(f"GCS emulator {self.process.pid} is still running")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._ports_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start on port {self.port} ---\n".encode())
        command = [sys.executable, "-m", "support.gcs", "--data-dir", str(self.directory / "data"),
                   "--bucket", self.bucket, "--port", str(self.port), "--ports-file", str(self._ports_file)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=TESTS)
        try:
            wait_until(lambda: self._ports_file.exists() or not self.alive, self.start_timeout_s,
                       "the GCS emulator's ports file")
            if not self.alive:
                raise GcsStartError(f"GCS emulator exited with {self.process.returncode}\n{self.log()}")
            self.port = json.loads(self._ports_file.read_text())["port"]
            wait_until(lambda: self._bucket_answers() or not self.alive, self.start_timeout_s,
                       f"GET {self.endpoint}/storage/v1/b/{self.bucket}")
        except AssertionError as exc:
            self.kill()
            raise GcsStartError(f"{exc}\n{self.log()}") from exc
        if not self.alive:
            raise GcsStartError(f"GCS emulator exited with {self.process.returncode}\n{self.log()}")
        return self

    def _bucket_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b/{self.bucket}", timeout=2) as resp:
                return resp.status == 200
        except urllib.error.HTTPError as exc:
            exc.close()
            return False
        except OSError:
            return False

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM (the process exits at once), then SIGKILL after ``grace_s``."""
        return self._signal(signal.SIGTERM, grace_s)

    def kill(self) -> int:
        """SIGKILL: a crash. Objects already written stay on disk."""
        return self._signal(signal.SIGKILL, 10.0)

    def _signal(self, sig: int, grace_s: float) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                return self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def client(self):
        """A google.cloud.storage.Client on this emulator, anonymous, independent of the environment."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def upload(self, objects: Mapping[str, bytes], durable: bool = True) -> None:
        """Write each ``{key: content}`` into the bucket through the official client. Always
        durable (on disk once answered); ``durable`` is there for Azurite's signature."""
        client = self.client()
        try:
            bucket = client.bucket(self.bucket)
            for key, content in objects.items():
                bucket.blob(key).upload_from_string(content, content_type="application/octet-stream")
        finally:
            client.close()

    def listing(self, prefix: str = "") -> dict[str, int]:
        """``{key: size}`` of the objects under ``prefix``, through the official client."""
        client = self.client()
        try:
            return {blob.name: blob.size for blob in client.list_blobs(self.bucket, prefix=prefix)}
        finally:
            client.close()

    def read(self, key: str) -> bytes:
        """Object ``key``'s content, through the official client."""
        client = self.client()
        try:
            return client.bucket(self.bucket).blob(key).download_as_bytes()
        finally:
            client.close()

    def __enter__(self) -> GcsEmulator:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"GcsEmulator({self.endpoint}, bucket={self.bucket!r}, alive={self.alive})"


@pytest.fixture
def gcs_emulator(tmp_path: Path) -> Iterator[GcsEmulator]:
    """A running emulator with an empty bucket ``models``; stopped after the test."""
    with GcsEmulator(tmp_path / "gcs").start() as emulator:
        yield emulator


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="gcp-storage-emulator on 127.0.0.1, reporting its port")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ports-file", type=Path, required=True)
    args = parser.parse_args(argv)

    from functools import partial
    from http.server import HTTPServer

    from gcp_storage_emulator.handlers.buckets import create_bucket
    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    storage = Storage(data_dir=str(args.data_dir.resolve()))
    create_bucket(args.bucket, storage)  # False when it exists (a restart)
    httpd = HTTPServer(("127.0.0.1", args.port), partial(RequestHandler, storage))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    partial_file = args.ports_file.with_suffix(".partial")
    partial_file.write_text(json.dumps({"port": httpd.server_address[1], "pid": os.getpid()}))
    partial_file.rename(args.ports_file)
    print(f"gcp-storage-emulator serving on http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1:])
