"""Sizes in bytes, the one parser and the one formatter of the CLI, simulator and scripts.

    parse_bytes("4GiB") == 4 << 30; parse_bytes("1.5GB") == 1_500_000_000
    parse_bytes("512mib"), parse_bytes("3 M"), parse_bytes("4Ki"), parse_bytes(1000)
    format_bytes(1536) == "1.5 KiB"; format_bytes(4 << 30) == "4 GiB"; format_bytes(512) == "512 B"

Decimal units (k, KB, M, MB, ...) are powers of 1000, binary ones (Ki, KiB, ...) powers of
1024, case-insensitive, with or without the final B. The formatter writes binary units.

Written here rather than taken from humanfriendly (last release 2021) or bitmath: the
two functions are a few lines, the sidecar imports them, and a library would bring its
own spellings to the CLI and error texts (humanfriendly also reads "5 megabytes").
"""

from __future__ import annotations

import re
from typing import Any

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?\s*", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
EXAMPLES = "e.g. 4GiB, 512MiB or 1000000"


def parse_bytes(value: Any) -> int:
    """'4GiB', '512MiB', '1.5GB', '1000' or an int -> bytes; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected bytes, {EXAMPLES}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative size")
        return value
    match = _SIZE.fullmatch(str(value))
    if not match or (match.group(3) and not match.group(2)):
        raise ValueError(f"expected bytes, {EXAMPLES}")
    number, factor = (
        match.group(1),
        (1024 if match.group(3) else 1000) ** _POWERS[match.group(2).lower()],
    )
    return int(number) * factor if number.isdigit() else int(float(number) * factor)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; whole multiples without decimals ('4 GiB'); below 1 KiB in bytes."""
    for unit, size in _BINARY:
        if abs(n) >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.1f} {unit}"
    return f"{int(n)} B"
