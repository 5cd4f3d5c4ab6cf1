"""tfscache.logs alone: text and JSON lines, context from contextvars, structured fields."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading

import pytest

from tfscache import logs


@pytest.fixture
def capture():
    """Install tfscache's handler on a StringIO; restore the root logger afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()

    def install(json_lines: bool) -> io.StringIO:
        logs.setup("INFO", json_lines=json_lines, stream=stream)
        return stream

    yield install
    for handler in root.handlers[:]:
        if getattr(handler, "tfscache", False):
            root.removeHandler(handler)
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


async def test_json_lines_carry_context_and_fields(capture):
    stream = capture(json_lines=True)
    log = logging.getLogger("tfscache.test")

    async def request() -> None:
        logs.bind(model="half_plus_two", request_id="r-1")
        log.info("serving %s", "half_plus_two")

    await asyncio.create_task(request())
    log.info("node %s: loaded %s", "n0", "a", extra={"model": "a", "version": 3, "node": "n0",
                                                     "duration_s": 0.25, "bytes": 1000})
    log.warning("plain")
    first, second, third = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert first["message"] == "serving half_plus_two"
    assert (first["model"], first["request_id"], first["level"], first["logger"]) == (
        "half_plus_two", "r-1", "INFO", "tfscache.test")
    assert "node" not in first
    # The context was bound in another task: it does not leak here.
    assert second == {**second, "message": "node n0: loaded a", "model": "a", "version": 3, "node": "n0",
                      "duration_s": 0.25, "bytes": 1000}
    assert "request_id" not in second
    assert set(third) == {"time", "level", "logger", "message"} and third["time"].endswith("Z")


def test_json_lines_keep_the_traceback(capture):
    stream = capture(json_lines=True)
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("tfscache.test").exception("failed")
    doc = json.loads(stream.getvalue())
    assert doc["message"] == "failed" and "ValueError: bad" in doc["exc_info"]


async def test_text_lines_append_the_context(capture):
    stream = capture(json_lines=False)

    async def request() -> None:
        logs.bind(node="node0", model="a")
        logging.getLogger("tfscache.test").info("hello %d", 7)

    await asyncio.create_task(request())
    line = stream.getvalue().strip()
    assert line.endswith(" INFO tfscache.test: hello 7 [model=a node=node0]")


def test_setup_replaces_its_own_handler_only(capture):
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    try:
        capture(json_lines=False)
        capture(json_lines=True)
        ours = [h for h in root.handlers if getattr(h, "tfscache", False)]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
        assert other in root.handlers
    finally:
        root.removeHandler(other)


@pytest.fixture
def worker():
    """Name this process a worker for one test; no worker afterwards."""
    yield logs.set_worker
    logs.set_worker(None)


async def test_a_worker_is_named_on_text_lines_from_tasks_and_threads(capture, worker):
    stream = capture(json_lines=False)
    log = logging.getLogger("tfscache.test")
    log.info("before")
    worker(2)

    async def request() -> None:
        logs.bind(model="a")
        log.info("in a task")

    await asyncio.create_task(request())
    await asyncio.to_thread(log.info, "in a thread")
    thread = threading.Thread(target=log.info, args=("in a plain thread",))  # no context copied there
    thread.start()
    thread.join()
    before, task, in_thread, plain = stream.getvalue().splitlines()
    assert before.endswith("tfscache.test: before")
    assert task.endswith("tfscache.test: in a task [worker=2 model=a]")
    assert in_thread.endswith("tfscache.test: in a thread [worker=2]")
    assert plain.endswith("tfscache.test: in a plain thread [worker=2]")


def test_a_worker_is_named_on_json_lines_and_gone_when_unset(capture, worker):
    stream = capture(json_lines=True)
    log = logging.getLogger("tfscache.test")
    worker(1)
    log.info("served", extra={"model": "m", "node": "node0"})
    worker(None)
    log.info("after")
    named, after = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (named["worker"], named["model"], named["node"], named["message"]) == (1, "m", "node0", "served")
    assert "worker" not in after
