"""Request logs for the simulator: CSV with a header row, or JSON Lines.

One request per row or line, with these fields (CSV columns in any order; other
columns and keys are ignored):

    time          seconds (any epoch) or an ISO 8601 timestamp
    model         the model name (routing is by name, as in tfscache)
    version       optional; empty, null or absent is its own "latest" version
    load_seconds  how long loading the model takes if this request misses (>= 0)
    bytes         the model's memory when resident (>= 0)
    service_seconds  optional: the node time the request takes (``tfscache simulate --load``;
                  absent or empty: ``--service-ms``)

Requests are replayed in time order (a log merged from several front ends may be out
of order; equal times keep their order in the file). Files ending in ``.gz`` are read
through gzip. A bad row raises ``TraceError`` naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

log = logging.getLogger("tfscache.sim.trace")

FIELDS = ("time", "model", "version", "load_seconds", "bytes", "service_seconds")
REQUIRED = ("time", "model", "load_seconds", "bytes")


class TraceError(ValueError):
    """A request log that cannot be read; the message names the file and line."""


@dataclass
class Trace:
    """A request log as columns; models are numbered keys in order of first request."""

    models: list[tuple[str, int | None]] = field(default_factory=list)
    """key -> (name, version)."""
    keys: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    service: list[float] = field(default_factory=list)
    """Node seconds per request from the log's ``service_seconds`` (-1: not given)."""

    def __len__(self) -> int:
        return len(self.keys)


def read_trace(path: str | Path) -> Trace:
    """Read a CSV or JSONL request log (chosen by extension, else by its first character)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    kind = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as stream:
            if kind.lower() not in (".csv", ".jsonl", ".ndjson", ".json"):
                head = stream.read(4096).lstrip()
                kind = ".jsonl" if head.startswith("{") else ".csv"
                stream.seek(0)
            rows = _jsonl_rows(stream, path) if kind.lower() != ".csv" else _csv_rows(stream, path)
            return _collect(rows, path)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise TraceError(f"{path}: cannot read: {e}") from e


def _collect(rows: Iterator[tuple[int, dict]], path: Path) -> Trace:
    trace = Trace()
    index: dict[tuple[str, int | None], int] = {}
    for line, row in rows:
        try:
            when, model, version, cost, size = _parse(row)
            service = _service(row)
        except ValueError as e:
            raise TraceError(f"{path}:{line}: {e}") from None
        key = index.get((model, version))
        if key is None:
            key = index[(model, version)] = len(trace.models)
            trace.models.append((model, version))
        trace.keys.append(key)
        trace.times.append(when)
        trace.load_seconds.append(cost)
        trace.sizes.append(size)
        trace.service.append(service)
    if any(b < a for a, b in zip(trace.times, trace.times[1:])):
        log.info("%s is not in time order; replaying it sorted by time", path)
        order = sorted(range(len(trace)), key=trace.times.__getitem__)
        for column in (trace.keys, trace.times, trace.load_seconds, trace.sizes, trace.service):
            column[:] = [column[i] for i in order]
    return trace


def _csv_rows(stream: io.TextIOBase, path: Path) -> Iterator[tuple[int, dict]]:
    reader = csv.reader(stream)
    header = next(reader, None)
    if header is None:
        return
    columns = [name.strip().lower() for name in header]
    missing = [name for name in REQUIRED if name not in columns]
    if missing:
        raise TraceError(
            f"{path}:1: the header row lacks {', '.join(missing)} "
            f"(expected columns: {', '.join(FIELDS)}; version and service_seconds are optional)"
        )
    wanted = [(columns.index(name), name) for name in FIELDS if name in columns]
    for row in reader:
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(columns):
            raise TraceError(f"{path}:{line}: {len(row)} fields, but the header has {len(columns)}")
        yield line, {name: row[i] for i, name in wanted}


def _jsonl_rows(stream: io.TextIOBase, path: Path) -> Iterator[tuple[int, dict]]:
    for line, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{line}: not JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise TraceError(f"{path}:{line}: expected a JSON object, got {type(row).__name__}")
        yield line, row


def _parse(row: dict) -> tuple[float, str, int | None, float, int]:
    for name in REQUIRED:
        if row.get(name) is None:
            raise ValueError(f"missing {name}")
    model = row["model"]
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-empty string, got {model!r}")
    version = row.get("version")
    if version is not None and version != "":
        version = _integer("version", version)
    else:
        version = None
    cost = _number("load_seconds", row["load_seconds"])
    if cost < 0:
        raise ValueError(f"load_seconds must not be negative, got {row['load_seconds']!r}")
    size = _integer("bytes", row["bytes"])
    if size < 0:
        raise ValueError(f"bytes must not be negative, got {row['bytes']!r}")
    return _time(row["time"]), model.strip(), version, cost, size


def _service(row: dict) -> float:
    value = row.get("service_seconds")
    if value is None or value == "":
        return -1.0
    seconds = _number("service_seconds", value)
    if seconds < 0:
        raise ValueError(f"service_seconds must not be negative, got {value!r}")
    return seconds


def _number(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _integer(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    number = _number(name, value)
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(number)


def _time(value: object) -> float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            try:
                return datetime.fromisoformat(value.strip()).timestamp()
            except ValueError:
                raise ValueError(
                    f"time must be seconds or an ISO 8601 timestamp, got {value!r}"
                ) from None
    return _number("time", value)
