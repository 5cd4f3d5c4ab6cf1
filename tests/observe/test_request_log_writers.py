"""The request log with many writers (``tfscache serve --workers N``): real processes append to one file.

Each writer is a separate Python process with its own ``RequestLog`` on the same path. They
open the file, say so, and wait; the test releases them together, and they write their rows
as fast as their writer threads go. Every row must come out whole, once, with one header, and
the simulator must replay the file.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tfscache.observe.requestlog import COLUMNS
from tfscache.sim.trace import read_trace

WRITERS = 4
ROWS = 3000
NODE = "node-" + "x" * 200  # long rows: a split write would show as a broken row

WRITER = """
import asyncio, sys
from tfscache.observe.requestlog import RequestLog

async def main(path, tag, rows, node):
    log = RequestLog(path)
    await log.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the test releases every writer at once
    for i in range(rows):
        log.write({"time": 1000.0 + i, "model": f"w{tag}", "version": i + 1, "load_seconds": 0.25,
                   "bytes": 1000 + i, "node": node, "cold": i % 2, "code": "OK", "prefetched": 0})
    await log.close()
    print("written", log.written, log.broken, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


def rows_of(path, json_lines: bool) -> tuple[list[str], list[dict]]:
    text = path.read_text()
    if json_lines:
        return [], [json.loads(line) for line in text.splitlines()]
    reader = csv.reader(text.splitlines())
    headers, rows = [], []
    for record in reader:
        if record == list(COLUMNS):
            headers.append(",".join(record))
        else:
            assert len(record) == len(COLUMNS), record[:3]
            rows.append(dict(zip(COLUMNS, record)))
    return headers, rows


@pytest.mark.parametrize("name", ["requests.csv", "requests.jsonl"])
def test_processes_writing_at_once_leave_every_row_whole_and_once(tmp_path, name):
    path = tmp_path / name
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(tag), str(ROWS), NODE],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for tag in range(WRITERS)]
    try:
        for writer in writers:
            assert writer.stdout.readline().strip() == "ready"
        for writer in writers:  # release them together
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert writer.stdout.readline().split() == ["written", str(ROWS), "False"]
            assert writer.wait(timeout=60) == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            writer.stdin.close()
            writer.stdout.close()
    json_lines = name.endswith(".jsonl")
    headers, rows = rows_of(path, json_lines)
    assert headers == ([] if json_lines else [",".join(COLUMNS)])
    assert path.read_text().startswith("time,") or json_lines
    seen = [(row["model"], int(row["version"])) for row in rows]
    assert len(seen) == WRITERS * ROWS
    assert set(seen) == {(f"w{tag}", i + 1) for tag in range(WRITERS) for i in range(ROWS)}
    assert {row["node"] for row in rows} == {NODE}
    # each writer's rows keep its order (one thread per process appends them in turn)
    for tag in range(WRITERS):
        mine = [v for m, v in seen if m == f"w{tag}"]
        assert mine == sorted(mine)
    trace = read_trace(path)
    assert len(trace) == WRITERS * ROWS
    assert sorted(trace.models) == sorted({(f"w{tag}", i + 1) for tag in range(WRITERS) for i in range(ROWS)})
