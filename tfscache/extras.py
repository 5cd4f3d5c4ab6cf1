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

from tfscache.kinds.triton.launcher import INSTALL_HINT as TRITON_HINT

# extra -> the top-level modules it brings
EXTRAS: dict[str, tuple[str, ...]] = {
    "node": ("tensorflow", "tensorflow_serving"),
    "sim": ("matplotlib",),
    "triton": ("numpy", "pytriton"),
    "storage": ("obstore",),
    "gpu": ("pynvml",),
}

# where `pip install 'tfscache[EXTRA]'` is not the whole story
_HINTS = {"triton": TRITON_HINT}


class MissingExtra(RuntimeError):
    """An extra a command needs is not installed; the message gives the command that installs it."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be found (none imported)."""
    return [name for name in EXTRAS[extra] if not _found(name)]


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails, or sys.modules[name] set to None
        return False


def install_hint(extra: str) -> str:
    return _HINTS.get(extra, f"pip install 'tfscache[{extra}]'")


def require(extra: str, what: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` is there; ``what`` needs it."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(f"{what} needs the [{extra}] extra ({', '.join(absent)} not installed): "
                           f"{install_hint(extra)}")
