"""fake-gcs-server with its one known departure from GCS corrected, for the test of a missing bucket.

fake-gcs-server answers an XML-API listing (``GET /BUCKET?list-type=2``) of a bucket that does
not exist with ``500`` and ``<Message>no bucket named NAME</Message>`` (``lstat DIR/NAME: no such
file or directory`` with its filesystem backend); GCS answers ``404`` with the code ``NoSuchBucket``
("The specified bucket does not exist."). ``GoogleAnswers(upstream)`` is a loopback HTTP proxy
in front of the server that passes every request and answer through unchanged except that one,
which it answers as GCS does. So tfscache's handling of GCS's own answer is tested against the
real server, and the server's own answer is tested without the proxy (tests/storage/test_tier.py).

    with GoogleAnswers("http://127.0.0.1:PORT") as proxy:
        proxy.endpoint        # "http://127.0.0.1:P": give it to obstore as GOOGLE_BASE_URL
        proxy.corrected       # how many answers it rewrote
"""

from __future__ import annotations

import http.client
import http.server
import re
import threading
import urllib.parse

# its memory backend's words, then its filesystem backend's (the bucket's directory is missing)
MISSING = re.compile(rb"<Message>(no bucket named [^<]+|lstat [^<]+: no such file or directory)</Message>")
NO_SUCH_BUCKET = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchBucket</Code>"
                  b"<Message>The specified bucket does not exist.</Message></Error>")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class GoogleAnswers:
    """The proxy (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.corrected = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    status, data = answer.status, answer.read()
                    out = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP]
                finally:
                    conn.close()
                listing = "list-type=" in urllib.parse.urlsplit(self.path).query
                if listing and status == 500 and MISSING.search(data):
                    proxy.corrected += 1
                    status, data = 404, NO_SUCH_BUCKET
                    out = [("Content-Type", "application/xml; charset=UTF-8")]
                self.send_response(status)
                for key, value in out:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> GoogleAnswers:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
