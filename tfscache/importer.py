"""The one ``"module:attribute"`` loader behind every table of implementations.

Tables name what they hold as strings (``KINDS``, ``POLICIES``, ``DISCOVERY``, the CLI's
``COMMANDS``), so that choosing one imports only it: a TF Serving sidecar never imports
Triton's adapter, and ``tfscache status`` never imports grpc servers (uvicorn's importer.py
does the same for its protocols and loops).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class ImportFromStringError(ValueError):
    """A target that is not ``"module:attribute"``, or names nothing that imports."""


def import_from_string(target: str) -> Any:
    """The attribute ``target`` names (``"package.module:name"``, dots allowed after the colon)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ImportFromStringError(
            f'import target {target!r} must be of the form "module:attribute"'
        )
    # ModuleNotFoundError propagates: a missing extra
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ImportFromStringError(
                f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return found


def load(table: Mapping[str, str], name: str, what: str) -> Any:
    """``table[name]`` imported; ValueError names ``what`` and the names the table knows."""
    try:
        target = table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None
    return import_from_string(target)
