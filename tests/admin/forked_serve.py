"""``tfscache serve`` started many times over, cheaply: forked from a process that imported it once.

A fresh interpreter spends most of a sidecar's start-up importing (grpc, aiohttp, tfscache),
and the durable-acknowledgement test starts serve 50 times. ``start_forked_serve`` runs each
start as a child of a ``multiprocessing`` fork server that imported ``tfscache.cli.serve``
once: the child runs ``tfscache.cli.serve.main(argv)``, the ``tfscache serve`` command itself (the same
code path from argument parsing on), as a process of its own: its own pid, its own event
loop, killed by SIGKILL like any other. Its stdout and stderr go to a log file.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["tfscache.cli.serve"])


def _serve(argv: list[str], log_path: str) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from tfscache.cli import serve

    sys.exit(serve.main(argv))


def start_forked_serve(argv: list[str], log_path: Path) -> multiprocessing.Process:
    """Start ``tfscache serve ARGV`` as a fork server's child; the started Process (``.pid``)."""
    process = _CONTEXT.Process(target=_serve, args=(argv, str(log_path)), daemon=True)
    process.start()
    return process
