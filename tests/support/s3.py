"""A real S3 protocol server for tests: moto's server (``moto[server]``) as its own process.

    from support.s3 import MotoServer

    with MotoServer(tmp_path) as server:
        server.endpoint            # "http://127.0.0.1:PORT"
        server.env                 # AWS_ENDPOINT_URL, dummy keys, region: for open_store
        client = server.client()   # a boto3 client for setting up buckets and objects
        server.get_count("bucket/key")  # GETs of that object in the request log so far
        server.kill()              # SIGKILL: the store dies mid-request
        server.start(port=server.port)  # back on the same port (moto's state is empty again)

The server binds port 0 and the port is read back from its log ("Running on
http://127.0.0.1:PORT"): nothing is bound, closed and handed over. Requests are counted
from werkzeug's request log (one line per request, written once its status is sent).
Only 127.0.0.1 is ever bound or dialled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.process import REPO

RUNNING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


class MotoServer:
    """One ``python -m moto.server`` on 127.0.0.1; a context manager that kills it on exit."""

    def __init__(self, directory: Path, start_timeout_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.launches = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {**ENV, "AWS_ENDPOINT_URL": self.endpoint}

    @property
    def log_path(self) -> Path:
        return self.directory / f"moto.{self.launches}.log"

    def start(self, port: int = 0) -> MotoServer:
        """Launch and wait until it reports its port (``port`` 0: any free one)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.launches += 1
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.start_timeout_s
        while not (match := RUNNING.search(self.log_text())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"moto server did not start:\n{self.log_text()[-4000:]}")
            time.sleep(0.05)  # polling a condition with a deadline
        self.port = int(match.group(1))
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def get_count(self, path: str) -> int:
        """GET requests for ``/path`` (e.g. "bucket/m/1/a.bin") in this launch's log."""
        pattern = re.compile(rf'"GET /{re.escape(path)}(\?[^ ]*)? HTTP/1\.[01]"')
        return len(pattern.findall(self.log_text()))

    def kill(self) -> None:
        """SIGKILL and reap; a no-op once dead."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def client(self):
        """A boto3 S3 client for this server (setup only; the code under test uses obstore)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=ENV["AWS_REGION"],
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            config=Config(request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required"))

    def __enter__(self) -> MotoServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.kill()
