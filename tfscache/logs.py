"""Logging set-up for tfscache's processes: text lines or JSON objects, one per line.

Context travels in contextvars, not in arguments: ``bind(model=..., node=...,
request_id=...)`` sets them for the running task (and the tasks it creates), and
every log line written there carries them. A log call may add structured fields of
its own with ``extra={"model": ..., "version": ..., "node": ..., "duration_s": ...,
"bytes": ...}``; those win over the context.

    tfscache.logs.setup("INFO", json_lines=True)
    log.info("node %s: loaded %s version %s", node, name, version,
             extra={"model": name, "version": version, "node": node, "duration_s": 0.5})

Text lines keep their usual shape (``2026-01-01 12:00:00,000 INFO tfscache.cache: ...``)
with the context appended as ``[model=a node=node0]``; JSON lines are objects with
``time``, ``level``, ``logger``, ``message``, the context and the structured fields.

A worker process of ``tfscache serve --workers N`` calls ``set_worker(id)`` once: every line
it writes then names it, ``[worker=1 model=a]`` or ``"worker": 1``, whatever task or thread
logs (a process-wide field, not a contextvar).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

model: contextvars.ContextVar[str | None] = contextvars.ContextVar("tfscache_model", default=None)
node: contextvars.ContextVar[str | None] = contextvars.ContextVar("tfscache_node", default=None)
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tfscache_request_id", default=None
)

_CONTEXT = {"model": model, "node": node, "request_id": request_id}
# Fields of the whole process, on every line from any task or thread: ``worker`` with --workers N.
_PROCESS: dict[str, Any] = {}
# Structured fields a log call may pass in ``extra`` (in this order in JSON).
FIELDS = (
    "model",
    "version",
    "node",
    "request_id",
    "reason",
    "duration_s",
    "bytes",
    "measured",
    "idle_s",
)
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def bind(**values: str | None) -> None:
    """Set context for the running task: ``bind(node="node0", model="a", request_id="...")``."""
    for key, value in values.items():
        _CONTEXT[key].set(value)


def set_worker(worker: int | str | None) -> None:
    """Name this process's worker (``tfscache serve --workers N``) on every log line from now on,
    from every task and thread; None: a process that is no worker (the default)."""
    if worker is None:
        _PROCESS.pop("worker", None)
    else:
        _PROCESS["worker"] = worker


def context() -> dict[str, Any]:
    """The process's fields (``worker``), then the context set here, without unset entries."""
    found = dict(_PROCESS)
    found.update((k, v) for k, var in _CONTEXT.items() if (v := var.get()) is not None)
    return found


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """Context, then the record's structured fields (which win), without unset entries."""
    found: dict[str, Any] = getattr(record, "tfscache_context", None) or {}
    found = dict(found)
    for key in FIELDS:
        value = getattr(record, key, None)
        if value is not None:
            found[key] = value
    return found


class ContextFilter(logging.Filter):
    """Copies the contextvars onto each record when it is made (in the task that logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "tfscache_context"):
            record.tfscache_context = context()
        return True


class TextFormatter(logging.Formatter):
    """The usual text line, with the context (not the structured fields) appended."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ctx = getattr(record, "tfscache_context", None)
        if ctx:
            line += " [" + " ".join(f"{k}={v}" for k, v in ctx.items()) + "]"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, context and fields, exc_info."""

    converter = time.gmtime  # times in UTC, marked Z

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(fields_of(record))
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)



def setup(level: str | int = "INFO", *, json_lines: bool = False, stream=None) -> logging.Handler:
    """Configure the root logger: one handler on ``stream`` (stderr), text or JSON lines.

    Replaces the handlers a previous call installed; returns the new handler.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.tfscache = True
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "tfscache", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
