"""The state file: atomic, durable round trips; unreadable files read as empty; the StateWriter."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from tfscache import errors
from tfscache.cache import state as cachestate
from tfscache.cache.state import CacheState, SavedVersion, StateWriter, load_state, save_state

WAIT_S = 30.0  # a bound on waits that should end at once, never a delay


def state(n: int, node: str = "127.0.0.1:1") -> CacheState:
    return CacheState(node, [SavedVersion(f"m{i}", i + 1, 1000 + i, True, 1700000000.5 + i) for i in range(n)],
                      {f"{i + 1}:m{i}": 1000 + i for i in range(n)})


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "node.cache.json"
    saved = CacheState("127.0.0.1:1", [SavedVersion("m", 3, 1234, True, 1700000000.5),
                                       SavedVersion("n", 1, 99, False, 1700000001.0, pinned=True)], {"3:m": 1234})
    save_state(path, saved)
    assert load_state(path) == saved
    assert [p.name for p in path.parent.iterdir()] == ["node.cache.json"]  # no temporary file left


def test_the_format_is_unchanged(tmp_path):
    """A file written before this version reads the same, and a new one has the same keys."""
    path = tmp_path / "node.cache.json"
    old = {"format": 1, "node": "n", "models": [{"name": "m", "version": 2, "bytes": 5, "measured": False,
                                                 "last_use": 1.5}], "learned": {"2:m": 5}}
    path.write_text(json.dumps(old))
    loaded = load_state(path)
    assert loaded == CacheState("n", [SavedVersion("m", 2, 5, False, 1.5, pinned=False)], {"2:m": 5})
    save_state(path, loaded)
    assert json.loads(path.read_text()) == {**old, "models": [{**old["models"][0], "pinned": False}]}


def test_missing_none_and_corrupt_files_read_as_empty(tmp_path, caplog):
    assert load_state(None) == CacheState()
    assert load_state(tmp_path / "absent.json") == CacheState()
    bad = tmp_path / "bad.json"
    for text in ["{not json", json.dumps({"format": 99, "models": []}),
                 json.dumps({"format": 1, "models": [{"name": "m"}]}), "", '{"format": 1, "mod']:
        bad.write_text(text)
        assert load_state(bad) == CacheState()
    assert "ignoring unreadable cache state file" in caplog.text


def test_save_to_none_is_a_no_op(tmp_path):
    save_state(None, CacheState("x"))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_is_logged_and_leaves_the_old_file(tmp_path, caplog, monkeypatch):
    path = tmp_path / "node.cache.json"
    save_state(path, state(1))

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cachestate.os, "fsync", full_disk)
    save_state(path, state(2))
    monkeypatch.undo()
    assert "cannot write cache state file" in caplog.text and "No space left" in caplog.text
    assert load_state(path) == state(1)
    assert [p.name for p in tmp_path.iterdir()] == ["node.cache.json"]


def test_a_reader_during_a_write_sees_the_old_file_whole(tmp_path, monkeypatch):
    """Held at its fsync, the new data is written but not renamed: the reader gets the old file."""
    path = tmp_path / "node.cache.json"
    save_state(path, state(1))
    at_fsync, go_on, real_fsync = threading.Event(), threading.Event(), os.fsync

    def held_fsync(fd):
        if not at_fsync.is_set():
            at_fsync.set()
            assert go_on.wait(WAIT_S)
        real_fsync(fd)

    monkeypatch.setattr(cachestate.os, "fsync", held_fsync)
    writer = threading.Thread(target=save_state, args=(path, state(50)))
    writer.start()
    try:
        assert at_fsync.wait(WAIT_S)
        assert load_state(path) == state(1)
        assert len(list(tmp_path.glob(".node.cache.json.*.tmp"))) == 1
    finally:
        go_on.set()
        writer.join(WAIT_S)
    assert load_state(path) == state(50)
    assert [p.name for p in tmp_path.iterdir()] == ["node.cache.json"]


KILLED_WRITER = """
import sys
from pathlib import Path
from tfscache.cache.state import CacheState, SavedVersion, save_state
path, i = Path(sys.argv[1]), 0
while True:
    i += 1
    n = 1 if i % 2 else 400  # alternate small and large files
    save_state(path, CacheState(str(i), [SavedVersion("m" * 50, v, v, True, 1.0) for v in range(n)]))
    print(i, flush=True)
"""


def test_sigkill_at_any_moment_leaves_a_readable_file(tmp_path, caplog):
    """A writer rewrites the file in a loop while this test reads it, then is SIGKILLed."""
    path = tmp_path / "node.cache.json"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        reads = 0
        for line in child.stdout:
            loaded = load_state(path)  # concurrent with the next write
            assert loaded.node and len(loaded.models) == (1 if int(loaded.node) % 2 else 400)
            reads += 1
            if int(line) >= 60:
                break
        child.send_signal(signal.SIGKILL)
        assert child.wait(WAIT_S) == -signal.SIGKILL
    finally:
        child.kill()
        child.stdout.close()
    assert reads > 0
    loaded = load_state(path)
    assert int(loaded.node) >= 60 and len(loaded.models) == (1 if int(loaded.node) % 2 else 400)
    assert "ignoring unreadable" not in caplog.text


class HeldWrites:
    """A StateWriter ``write`` that records each state; after ``hold()`` each write waits for ``allow()``."""

    def __init__(self) -> None:
        self.states: list[CacheState] = []
        self.entered = threading.Event()  # a write is in its thread
        self.held = False
        self.permits = threading.Semaphore(0)
        self.threads: set[int] = set()

    def hold(self) -> None:
        self.held = True

    def allow(self) -> None:
        """Let one held write finish."""
        self.permits.release()

    def __call__(self, path, state: CacheState) -> None:
        self.threads.add(threading.get_ident())
        self.entered.set()
        if self.held:
            assert self.permits.acquire(timeout=WAIT_S)
        self.states.append(state)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT_S)
        self.entered.clear()


async def still_waiting(awaitable, within: float = 0.05) -> bool:
    """True if ``awaitable`` (a task) has not finished within a short wait."""
    try:
        await asyncio.wait_for(asyncio.shield(awaitable), within)
    except TimeoutError:
        return True
    return False


async def test_writes_coalesce_while_one_is_in_flight(tmp_path):
    writes = HeldWrites()
    writer = StateWriter(tmp_path / "s.json", write=writes)
    current = {"n": 0}
    writes.hold()
    writer.schedule(lambda: state(current["n"]))
    await writes.wait_entered()
    for n in range(1, 101):  # all during the held write
        current["n"] = n
        writer.schedule(lambda: state(current["n"]))
    flushed = asyncio.create_task(writer.flush())
    assert await still_waiting(flushed)
    writes.allow()
    await writes.wait_entered()  # the one write that follows
    assert await still_waiting(flushed)
    writes.allow()
    await asyncio.wait_for(flushed, WAIT_S)
    assert [len(s.models) for s in writes.states] == [0, 100]  # exactly one more write, of the latest state
    assert threading.get_ident() not in writes.threads  # off the event loop's thread
    await writer.close()
    assert len(writes.states) == 2


async def test_schedules_before_the_write_starts_are_one_write(tmp_path):
    writes = HeldWrites()
    writer = StateWriter(tmp_path / "s.json", write=writes)
    calls = []
    for n in range(10):
        writer.schedule(lambda n=n: calls.append(n) or state(n))
    await writer.flush()
    assert calls == [9] and [len(s.models) for s in writes.states] == [9]  # state_fn runs at write time


async def test_schedule_does_not_block_the_event_loop(tmp_path):
    writes = HeldWrites()
    writes.hold()
    writer = StateWriter(tmp_path / "s.json", write=writes)
    writer.schedule(lambda: state(1))
    await writes.wait_entered()
    writer.schedule(lambda: state(2))  # returns though a write is held in its thread
    assert writer.pending
    ticked = asyncio.Event()
    asyncio.get_running_loop().call_soon(ticked.set)
    await asyncio.wait_for(ticked.wait(), WAIT_S)  # the loop runs meanwhile
    writes.allow()
    writes.allow()
    await asyncio.wait_for(writer.close(), WAIT_S)
    assert not writer.pending


async def test_flush_returns_once_the_data_is_on_disk(tmp_path):
    path = tmp_path / "node.cache.json"
    writer = StateWriter(path)
    await writer.flush()  # nothing scheduled: returns at once
    assert not path.exists()
    for n in range(1, 6):
        writer.schedule(lambda n=n: state(n))
        await writer.flush()
        assert load_state(path) == state(n)
    writer.schedule(lambda: state(7))
    await writer.close()
    assert load_state(path) == state(7)
    assert [p.name for p in tmp_path.iterdir()] == ["node.cache.json"]
    with pytest.raises(RuntimeError, match="closed"):
        writer.schedule(lambda: state(8))


async def test_a_flush_waits_for_the_write_after_the_one_in_flight(tmp_path):
    writes = HeldWrites()
    writer = StateWriter(tmp_path / "s.json", write=writes)
    writes.hold()
    writer.schedule(lambda: state(1))
    await writes.wait_entered()
    first = asyncio.create_task(writer.flush())  # covered by the write in flight
    assert await still_waiting(first)  # (and now running: it counted what was scheduled so far)
    writer.schedule(lambda: state(2))
    second = asyncio.create_task(writer.flush())  # needs the next write
    writes.allow()
    await asyncio.wait_for(first, WAIT_S)
    await writes.wait_entered()
    assert await still_waiting(second)
    writes.allow()
    await asyncio.wait_for(second, WAIT_S)
    assert [len(s.models) for s in writes.states] == [1, 2]


async def test_a_failing_write_is_logged_and_does_not_stop_the_writer(tmp_path, caplog):
    path = tmp_path / "node.cache.json"
    writer = StateWriter(path)

    def broken() -> CacheState:
        raise ValueError("state_fn broke")

    writer.schedule(broken)
    await asyncio.wait_for(writer.flush(), WAIT_S)
    assert "cannot write cache state file" in caplog.text and not path.exists()
    writer.schedule(lambda: state(3))
    await asyncio.wait_for(writer.close(), WAIT_S)
    assert load_state(path) == state(3)


async def test_no_path_writes_nothing(tmp_path):
    writer = StateWriter(None)
    writer.schedule(lambda: pytest.fail("state_fn called without a path"))
    await writer.close()
    assert list(tmp_path.iterdir()) == []


async def test_a_failed_write_fails_the_flushes_it_covered_and_not_close(tmp_path):
    def failing(path, state):
        raise OSError(28, "No space left on device")

    writer = StateWriter(tmp_path / "s.json", write=failing)
    writer.schedule(lambda: state(1))
    with pytest.raises(errors.Internal) as caught:
        await writer.flush()
    assert caught.value.message == (f"the state file {tmp_path / 's.json'} could not be written: "
                                    "[Errno 28] No space left on device")
    assert not writer.pending and writer.writes == 1  # done, not retried forever
    writer.schedule(lambda: state(2))
    await asyncio.wait_for(writer.close(), WAIT_S)  # logged, not raised
    assert writer.writes == 2
