"""tfscache.tasks.cancel: a background loop ends even when a cancellation is swallowed."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tfscache.tasks import cancel


def _watch_loop(futures: asyncio.Queue) -> asyncio.Task:
    """A loop like the discovery watches: each round waits for a reply with ``wait_for``."""
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        while True:
            reply = loop.create_future()
            futures.put_nowait(reply)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(reply, 30)

    return asyncio.create_task(watch())


async def test_a_cancellation_that_arrives_with_the_reply_still_ends_the_loop():
    futures: asyncio.Queue = asyncio.Queue()
    task = _watch_loop(futures)
    reply = await futures.get()
    # The reply completes and the task is cancelled in the same turn of the loop: on Python
    # 3.11, wait_for returns the reply and the cancellation is gone (gh-86296), so one
    # cancel() and an await of the task would wait forever.
    reply.set_result(None)
    await asyncio.wait_for(cancel(task), 10)
    assert task.cancelled()


async def test_a_loop_that_failed_is_waited_for_without_raising():
    async def fails() -> None:
        raise RuntimeError("the loop failed")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)  # let it run once and fail
    await cancel(task)
    assert task.done() and not task.cancelled()
    await cancel(None)


async def test_the_callers_own_cancellation_propagates():
    refused: asyncio.Queue = asyncio.Queue()
    done = False

    async def refuses_to_stop() -> None:
        while not done:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                refused.put_nowait(None)

    task = asyncio.create_task(refuses_to_stop())
    await asyncio.sleep(0)  # it waits
    stopper = asyncio.create_task(cancel(task))
    for _ in range(2):  # cancelled, refused, cancelled again
        await asyncio.wait_for(refused.get(), 10)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert not task.done()
    done = True
    task.cancel()
    await asyncio.wait_for(task, 10)
