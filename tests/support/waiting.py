"""Waiting for a condition with a deadline, and for a process that is not our child to end.

    wait_until(lambda: health_check(target) == SERVING, 60, "health SERVING")
    wait_until(lambda: process_ended(pid), 30, f"node {pid} to exit")
    await until(lambda: cache.is_resident("addk_1"), 30, "addk_1 to load")  # on the event loop

``wait_until`` polls; it never sleeps in the hope that something has happened. ``until`` is its
twin for a test on the event loop: the loop runs between polls, and ``condition`` may be async.
These are the tests' only polling helpers: a wait with more to it (a node's version states, a
log line) is built on them or has its own name.
"""

from __future__ import annotations

import asyncio
import inspect
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
            raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                                 f" (last: {value!r})")
        time.sleep(interval)  # polling a condition with a deadline


async def until(condition: Callable[[], object], timeout: float, what: str,
                interval: float = 0.02):
    """``wait_until`` on the event loop: poll ``condition`` (a function, or one returning an
    awaitable) until its value is truthy, and return that; AssertionError naming ``what`` (and
    the last value) once ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                                 f" (last: {value!r})")
        await asyncio.sleep(interval)  # polling a condition with a deadline


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has exited, every thread of it: gone, or a zombie nobody reaped yet
    (a child of a killed parent, reparented to an init that may not reap it).

    The thread-group leader turns zombie as soon as its own thread has exited, while the others
    may still be exiting and holding the process's files (its listening sockets among them): so
    each task under /proc/PID/task must have exited too."""
    try:
        tasks = [Path(f"/proc/{pid}/stat")] + list(Path(f"/proc/{pid}/task").glob("*/stat"))
    except (FileNotFoundError, ProcessLookupError):
        return True
    for stat_file in tasks:
        try:
            stat = stat_file.read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # that thread is gone
        # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces or parentheses).
        if stat[stat.rindex(")") + 2] not in "ZX":
            return False
    return True


def traffic_runs(process, seconds: float, enough: Callable[[], bool], most_s: float = 120.0) -> None:
    """Let traffic run for ``seconds`` and then on until ``enough()`` (a sampler has sampled
    enough times: a loaded machine samples slower), unless ``process`` (the server under test)
    exits first; AssertionError if ``enough()`` still fails after ``most_s``."""
    deadline = time.monotonic() + seconds
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the length of the traffic is what is measured
    if process.poll() is None:
        wait_until(lambda: enough() or process.poll() is not None, most_s, "enough samples")


async def within(awaitable, timeout: float, what: str):
    """``await awaitable`` for ``timeout`` s at most; past that, fail naming ``what`` with the
    stack of every task on the loop, so that a hang (a stop that never ends) says where it is
    rather than running into pytest's timeout."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        stacks = []
        for task in asyncio.all_tasks():
            frames = task.get_stack()
            where = " <- ".join(f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno} "
                                f"{f.f_code.co_name}" for f in reversed(frames))
            stacks.append(f"{task.get_name()}: {where}")
        raise AssertionError(f"{what}: not done in {timeout} s; tasks:\n" + "\n".join(stacks))
