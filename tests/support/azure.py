"""Azurite (Microsoft's Azure Storage emulator, npm) as a test server of its own process.

    from support.azure import Azurite

    with Azurite(tmp_path).start() as azurite:
        azurite.upload({"half_plus_two/1/saved_model.pb": b"..."})  # into azurite.container
        azurite.blob_endpoint      # "http://127.0.0.1:P/devstoreaccount1"
        azurite.env                # AZURE_STORAGE_* for a client configured by the environment
        azurite.connection_string  # what azure-storage-blob and adlfs take
        azurite.listing("m/1/"), azurite.read("m/1/saved_model.pb")   # {name: size}, bytes
        azurite.kill()             # SIGKILL (a crash); azurite.stop() is SIGTERM, then SIGKILL
        azurite.start()            # again, on the same port, with the same blobs

or adopt the fixture: ``azurite = support.azure.azurite`` (container ``models``).

Only the Blob service runs (``azurite-blob``), from ``.azurite/`` in the repository
(``scripts/install_azurite.sh``; ``TFSCACHE_TEST_AZURITE`` names another binary). It binds
127.0.0.1 port 0 and the port is read back from its log ("successfully listens on
http://127.0.0.1:P"); a restart asks for that port again. Blobs live under
``directory/data``, but their metadata (container and blob list, ETags) sits in memory
(LokiJS) and is saved only every 5 s and on SIGTERM: a SIGKILL within 5 s of an upload
loses the blob, even the container. So ``upload`` returns once the saved metadata holds
every blob it wrote, with its ETag (``durable=False`` skips that wait, up to 5 s). The
account is Azurite's fixed development account, its key published by Microsoft; URLs are
path-style, ``http://127.0.0.1:P/devstoreaccount1/CONTAINER/BLOB``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from support.process import REPO
from support.waiting import wait_until

AZURITE = os.environ.get("TFSCACHE_TEST_AZURITE", str(REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"))
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key, the same in every installation (not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
LISTENING = re.compile(r"successfully listens on http://127\.0\.0\.1:(\d+)")


class AzuriteStartError(RuntimeError):
    """Azurite is not installed, exited, or did not answer in time; the message says which."""


class Azurite:
    """One ``azurite-blob`` process: its directory, port (fixed after the first start) and container."""

    def __init__(self, directory: Path, container: str = "models", start_timeout_s: float = 60.0) -> None:
        self.directory = Path(directory)
        self.container = container
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.launches = 0

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.blob_endpoint};")

    @property
    def env(self) -> dict[str, str]:
        """Azure's standard variables, pointing at this Azurite: the connection string (Azure
        CLI, adlfs; azure-storage-blob via ``from_connection_string``) and account, key and
        endpoint (obstore's AzureStore, which needs ``allow_http`` for the http:// endpoint)."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string,
                "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": KEY,
                "AZURE_STORAGE_ENDPOINT": self.blob_endpoint}

    @property
    def log_path(self) -> Path:
        return self.directory / f"azurite.{self.launches}.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Azurite:
        """Launch, on port 0 the first time and on the same port after; return once it
        answers HTTP and the container exists (created if missing)."""
        if self.alive:
            raise RuntimeError(f"Azurite {self.process.pid} is still running")
        if not os.access(AZURITE, os.X_OK):
            raise AzuriteStartError(f"{AZURITE} not found: run scripts/install_azurite.sh")
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        self.launches += 1
        command = [AZURITE, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                   "--location", str(self.directory / "data"), "--skipApiVersionCheck",
                   "--disableTelemetry", "--silent"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.directory)
        try:
            match = wait_until(lambda: LISTENING.search(self.log()) or not self.alive,
                               self.start_timeout_s, "Azurite to report its port")
            if not self.alive:
                raise AzuriteStartError(f"Azurite exited with {self.process.returncode}\n{self.log()}")
            self.port = int(match.group(1))
            wait_until(self._answers, self.start_timeout_s, f"Azurite on {self.blob_endpoint}")
            self._create_container()
        except AssertionError as exc:
            self.kill()
            raise AzuriteStartError(f"{exc}\n{self.log()}") from exc
        return self

    def _answers(self) -> bool:
        """Whether any HTTP answer comes back (an anonymous request is refused: that counts)."""
        try:
            with urllib.request.urlopen(f"{self.blob_endpoint}?comp=list", timeout=2):
                return True
        except urllib.error.HTTPError as exc:
            exc.close()
            return True
        except OSError:
            return False

    def _create_container(self) -> None:
        from azure.core.exceptions import ResourceExistsError

        with self.service() as service:
            try:
                service.create_container(self.container)
            except ResourceExistsError:
                pass

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM (Azurite saves its metadata and exits at once), then SIGKILL after ``grace_s``."""
        return self._signal(signal.SIGTERM, grace_s)

    def kill(self) -> int:
        """SIGKILL: a crash. Metadata not saved yet is lost (module docstring)."""
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

    def service(self):
        """An azure.storage.blob.BlobServiceClient on this Azurite (a context manager)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def upload(self, objects: Mapping[str, bytes], durable: bool = True) -> dict[str, str]:
        """Write each ``{name: content}`` into the container through the official client;
        with ``durable``, return once Azurite has saved them (they survive ``kill``).
        Returns ``{name: etag}``."""
        with self.service() as service:
            container = service.get_container_client(self.container)
            etags = {name: container.get_blob_client(name).upload_blob(content, overwrite=True)["etag"]
                     for name, content in objects.items()}
        if durable:
            wanted = {(self.container, name, etag) for name, etag in etags.items()}
            wait_until(lambda: wanted <= self._saved_blobs(), 15.0, "Azurite to save its blob metadata")
        return etags

    def _saved_blobs(self) -> set[tuple[str, str, str]]:
        """(container, blob, etag) of every blob in Azurite's saved metadata (LokiJS's file)."""
        try:
            db = json.loads((self.directory / "data" / "__azurite_db_blob__.json").read_text())
        except (OSError, ValueError):  # not written yet, or caught mid-write
            return set()
        blobs = next((c["data"] for c in db["collections"] if c["name"] == "$BLOBS_COLLECTION$"), [])
        return {(b["containerName"], b["name"], b["properties"]["etag"]) for b in blobs if not b.get("deleted")}

    def listing(self, prefix: str = "") -> dict[str, int]:
        """``{name: size}`` of the blobs under ``prefix``, through the official client."""
        with self.service() as service:
            container = service.get_container_client(self.container)
            return {blob.name: blob.size for blob in container.list_blobs(name_starts_with=prefix)}

    def read(self, name: str) -> bytes:
        """Blob ``name``'s content, through the official client."""
        with self.service() as service:
            return service.get_blob_client(self.container, name).download_blob().readall()

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Azurite({self.blob_endpoint}, container={self.container!r}, alive={self.alive})"


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[Azurite]:
    """A running Azurite with an empty container ``models``; stopped after the test."""
    with Azurite(tmp_path / "azurite").start() as emulator:
        yield emulator
