"""Sizes in bytes as people write them: '4GiB', '512MiB', '1.5GB', '1000'."""

from __future__ import annotations

import re
from typing import Any

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value: Any) -> int:
    """'4GiB', '512MiB', '1.5GB', '1000' or an int -> bytes."""
    if isinstance(value, bool):
        raise ValueError("not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative size")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError("expected bytes, e.g. 4GiB, 512MiB or 1000000")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
