"""Stopping background tasks: ``cancel`` ends a task even when one cancellation is lost.

Python 3.11's ``asyncio.wait_for`` can swallow a cancellation: when the task is cancelled in
the same turn of the loop as the future it waits for completes, ``wait_for`` returns that
future's result and the ``CancelledError`` is gone (CPython gh-86296, fixed in 3.12 by the
rewrite of ``wait_for`` on ``asyncio.timeout``). A background loop that met it once runs on,
and a plain ``task.cancel(); await task`` waits for it forever. dnspython's resolver waits
for each reply with ``wait_for``, so a discovery watch polling DNS every 100 ms met it in CI:
a sidecar's stop never returned. ``cancel`` therefore cancels again until the task has ended.
"""

from __future__ import annotations

import asyncio

# how long a cancelled task is given to end before it is cancelled once more
RETRY_S = 0.05


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has ended, cancelling again if a cancellation
    was swallowed. The task's own exception, if it ended with one, is retrieved and dropped;
    a cancellation of the caller itself propagates."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RETRY_S)
    if not task.cancelled():
        task.exception()  # retrieved: a loop that failed was logged where it failed
