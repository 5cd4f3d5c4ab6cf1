"""LoaderHarness: the managed versions, their states, and how a servable is loaded.

What ServingCore (server_core.py) keeps per version and does to load one, apart from
the manager's scheduling:

* ``State`` and ``ServableState`` are the published states (ModelVersionStatus.State,
  with the error of a failed load); ``Harness`` is LoaderHarness's internal state and
  ``ManagedVersion`` one managed version: its harness state plus its handle count.
* ``load_with_retries`` is LoaderHarness::Load's retry loop (max_num_load_retries,
  load_retry_interval_micros; retries stop when the version is no longer aspired).
  ``gated_load`` is one attempt: the --load_gate_dir fault injection (docs/DESIGN.md),
  then the loader, by default servable.load_servable (``saved_model_loader``).
* ``release_memory`` gives the heap of an unloaded servable back to the OS, and
  ``rss_bytes`` is the resident size logged after each load and unload.

ServingCore owns the ``ManagedVersion`` objects and changes them under its lock; the
published states go to state_monitor.py.
"""

from __future__ import annotations

import ctypes
import enum
import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tfscache.errors import Internal, TfscacheError, code_name

# The manager's logger name, kept from before this code left server_core.py, so the node's
# log lines (which tests and operators match on) read as they did.
log = logging.getLogger("tfscache.node.manager")


class State(enum.IntEnum):
    """Published servable states, numbered as ModelVersionStatus.State."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


class Harness(enum.Enum):
    """LoaderHarness states (the internal ones, not the published ones)."""

    NEW = "new"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    DISABLED = "disabled"
    ERROR = "error"


@dataclass
class ServableState:
    state: State
    error: TfscacheError | None = None


@dataclass(eq=False)
class ManagedVersion:
    """One managed version: a LoaderHarness plus its handle count."""

    name: str
    version: int
    path: str
    harness: Harness = Harness.NEW
    aspired: bool = True
    servable: object | None = None
    refs: int = 0
    cancel_retry: threading.Event = field(default_factory=threading.Event)


def saved_model_loader(tags: tuple[str, ...], warmup_iterations: int | None = 1,
                       ) -> Callable[[str, int, str], object]:
    """The default loader: ``load(name, version, path)`` -> servable.load_servable with ``tags``,
    then the version's warm-up records replayed ``warmup_iterations`` times each (warmup.py; None:
    no warm-up); a failed warm-up unloads the servable and fails the load."""
    def load(name: str, version: int, path: str):
        from tfscache.modelserver.servable import load_servable
        from tfscache.modelserver.warmup import warm_up

        servable = load_servable(name, version, path, tags=tags)
        if warmup_iterations is not None:
            try:
                warm_up(servable, warmup_iterations)
            except BaseException:
                servable.unload()
                raise
        return servable

    return load


def load_with_retries(
    entry: ManagedVersion,
    load: Callable[[ManagedVersion], object],
    attempts: int,
    interval_s: float,
    stopped: threading.Event,
) -> tuple[object | None, TfscacheError | None]:
    """LoaderHarness::Load: (the servable, None), or (None, the last attempt's error).

    Up to ``attempts`` calls of ``load(entry)``, ``interval_s`` apart; no more once
    the version is no longer aspired (``entry.cancel_retry``) or ``stopped`` is set.
    """
    error: TfscacheError | None = None
    for attempt in range(attempts):
        try:
            servable = load(entry)
            error = None
            break
        except TfscacheError as exc:
            error = exc
        except Exception as exc:  # a loader bug or a TF error not mapped by servable.py
            log.exception("loading %s version %s failed", entry.name, entry.version)
            error = Internal(str(exc) or type(exc).__name__)
        log.error("Loading servable: {name: %s version: %s} failed: %s: %s",
                  entry.name, entry.version, code_name(error.grpc_code), error.message)
        if attempt + 1 == attempts or entry.cancel_retry.is_set():
            break
        log.info("Retrying load of %s version %s (attempt %d of %d)",
                 entry.name, entry.version, attempt + 2, attempts)
        if interval_s > 0 and (entry.cancel_retry.wait(interval_s) or stopped.is_set()):
            break
    if error is not None:
        return None, error
    return servable, None


def gated_load(entry: ManagedVersion, loader: Callable[[str, int, str], object],
               gate_dir: str | None, stopped: threading.Event) -> object:
    """One load attempt: held while ``NAME.hold`` exists, failed if ``NAME.fail`` does."""
    if gate_dir:
        hold = Path(gate_dir, f"{entry.name}.hold")
        if hold.exists():
            Path(gate_dir, f"{entry.name}.{entry.version}.waiting").touch()
            while hold.exists() and not stopped.is_set():
                time.sleep(0.01)
        if Path(gate_dir, f"{entry.name}.fail").exists():
            raise Internal(f"injected load failure for {entry.name}")
    return loader(entry.name, entry.version, entry.path)


_libc_malloc_trim: Callable[[int], int] | None = None
try:
    _libc_malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc
    pass


def release_memory() -> None:
    """Give freed heap back to the OS where the allocator allows (glibc malloc_trim)."""
    gc.collect()
    if _libc_malloc_trim is not None:
        _libc_malloc_trim(0)


def rss_bytes() -> int:
    """This process's resident set size, logged after each load and unload."""
    return psutil.Process().memory_info().rss
