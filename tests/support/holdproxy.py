"""A TCP proxy in front of a test server that can hold every request: what reaches the store
while a request is being served, counted, without timing anything.

    with HoldProxy(("127.0.0.1", moto.port)) as proxy:
        proxy.endpoint            # "http://127.0.0.1:P": give it to the client instead of the server's
        with proxy.holding():     # bytes from clients stop here (new and kept-alive connections alike)
            ...                   # a client that needed the store now waits until the block ends
            proxy.held_chunks     # how many client sends arrived while held
        proxy.sends               # client sends forwarded so far

Threads, one per direction of each connection; 127.0.0.1 only, port 0 read back.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class HoldProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.held_chunks = 0
        self.sends = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="holdproxy-accept").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @contextlib.contextmanager
    def holding(self):
        """Hold every client send until the block ends; ``held_chunks`` counts them from zero."""
        with self._lock:
            self.held_chunks = 0
        self._open.clear()
        try:
            yield self
        finally:
            self._open.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._relay, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client, False), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while chunk := source.recv(1 << 16):
                if from_client:
                    if not self._open.is_set():
                        with self._lock:
                            self.held_chunks += 1
                        self._open.wait()
                    with self._lock:
                        self.sends += 1
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._open.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> HoldProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
