"""Client threads that send requests in a loop until stopped, and check what came back.

    with MyTraffic(models, clients=16) as traffic:   # a subclass: how one worker sends
        wait_until(lambda: traffic.ok() >= 100, 120, "warm traffic")
    traffic.check()                                   # none failed, every y == x + k

A subclass implements ``client(worker)``, which sets up that worker's client and calls
``self.loop(worker, send)`` with ``send(name, x) -> y``; an exception of ``errors`` is
recorded as the request's result. Results are ``(name, x, y or exception, start, end)``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def addk_of(name: str) -> float:
    """k of ``addk_K`` (``y = x + k``)."""
    return float(name.rsplit("_", 1)[1])


def describe(exc: BaseException) -> str:
    """An exception with its text: tritonclient's InferenceServerException keeps its status and
    message out of ``args``, so its repr alone reads ``InferenceServerException()``."""
    return f"{type(exc).__name__}({str(exc)!r})"


class ClientLoop:
    errors: tuple[type[BaseException], ...] = (Exception,)

    def __init__(self, models: list[str], clients: int = 16, timeout: float = 30.0) -> None:
        self.models, self.timeout = models, timeout
        self.results: list[tuple[str, float, object, float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self.client, args=(w,)) for w in range(clients)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 30)

    def client(self, worker: int) -> None:
        raise NotImplementedError  # the subclass's transport

    def loop(self, worker: int, send: Callable[[str, float], object]) -> None:
        """Send ``models`` in turn, x distinct per worker and request, until stopped."""
        i = 0
        while not self._stop.is_set():
            name, x = self.models[(worker + i) % len(self.models)], float(worker * 1000 + i)
            i += 1
            start = time.monotonic()
            try:
                y = send(name, x)
            except self.errors as exc:
                y = exc
            with self._lock:
                self.results.append((name, x, y, start, time.monotonic()))

    def snapshot(self) -> list[tuple[str, float, object, float, float]]:
        """The results so far, copied while the clients keep sending."""
        with self._lock:
            return list(self.results)

    def done(self) -> int:
        with self._lock:
            return len(self.results)

    def ok(self) -> int:
        with self._lock:
            return sum(not isinstance(r[2], BaseException) for r in self.results)

    def failures(self) -> list[tuple[str, object]]:
        return [(r[0], r[2]) for r in self.results if isinstance(r[2], BaseException)]

    def check(self) -> None:
        """No failed request, and every answer right (y = x + k)."""
        failures = [(name, describe(exc)) for name, exc in self.failures()]
        assert not failures, f"{len(failures)} failed of {len(self.results)}: {failures[:5]}"
        wrong = [(name, x, y) for name, x, y, _, _ in self.results if y != [x + addk_of(name)]]
        assert not wrong, f"{len(wrong)} wrong answers of {len(self.results)}: {wrong[:5]}"
