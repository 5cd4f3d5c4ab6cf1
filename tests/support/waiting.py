"""Waiting for a condition with a deadline, and for a process that is not our child to end.

    wait_until(lambda: health_check(target) == SERVING, 60, "health SERVING")
    wait_until(lambda: process_ended(pid), 30, f"node {pid} to exit")

``wait_until`` polls; it never sleeps in the hope that something has happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; AssertionError
    naming ``what`` (and the last value) once ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {value!r})")
        time.sleep(interval)  # polling a condition with a deadline


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has exited: gone, or a zombie nobody reaped yet (a child of a
    killed parent, reparented to an init that may not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces or parentheses).
    return stat[stat.rindex(")") + 2] in "ZX"
