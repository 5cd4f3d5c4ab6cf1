"""The optional extras of the tfscache package, and a check that one is installed.

A command that needs an extra checks for it before it starts anything, so a missing one
fails at once with the pip command that installs it (exit status 2), not after a whole
simulation or once a child process has crashed. The check finds the modules without
importing them: looking for tensorflow costs nothing, importing it costs seconds.

    tfscache node                       [node]     tensorflow, tensorflow_serving
    tfscache simulate --plot            [sim]      matplotlib
    tfscache serve --backend triton     [triton]   numpy, and the nvidia-pytriton wheel
    tfscache serve with s3://, gs://, az://  [storage]  obstore (checked by tfscache.settings)
    tfscache serve --gpu-memory-per-node   [gpu]      pynvml (nvidia-ml-py)
"""

from __future__ import annotations

import importlib.util

# extra -> the top-level modules it brings
EXTRAS: dict[str, tuple[str, ...]] = {
    "node": ("tensorflow", "tensorflow_serving"),
    "sim": ("matplotlib",),
    "storage": ("obstore",),
    "gpu": ("pynvml",),
}


class MissingExtra(RuntimeError):
    """An extra a command needs is not installed; the message gives the command that installs it."""


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (``modules``: a node kind's, tfscache.kinds.table) that cannot be
    found (none imported)."""
    return [name for name in (EXTRAS[extra] if modules is None else modules) if not _found(name)]


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    # a parent package that fails, or sys.modules[name] set to None
    except (ImportError, ValueError):
        return False


def require(
    extra: str, what: str, *, modules: tuple[str, ...] | None = None, install: str = ""
) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` is there; ``what`` needs it.
    ``modules`` and ``install``: a node kind's extra and the command that installs it."""
    absent = missing(extra, modules)
    if absent:
        install = install or f"pip install 'tfscache[{extra}]'"
        raise MissingExtra(
            f"{what} needs the [{extra}] extra ({', '.join(absent)} not installed): {install}"
        )
