"""tfscache.units: the one byte-size parser and formatter."""

from __future__ import annotations

import pytest

from tfscache.units import format_bytes, parse_bytes


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("1024", 1024), (1000, 1000), ("4KiB", 4096), ("4Ki", 4096), ("1.5GiB", 3 * 2**29),
    ("2GB", 2 * 10**9), ("1.5GB", 1_500_000_000), ("512mib", 512 * 2**20), ("3 M", 3 * 10**6),
    ("2 kib", 2048), ("1TiB", 2**40), (".5k", 500), ("100b", 100), ("12345678901234567890", 12345678901234567890),
])
def test_parse_bytes(text, value) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "iB", "1 iB", "1.5 parsecs", "-1GiB", "1e3", True, -1])
def test_parse_bytes_rejects(text) -> None:
    with pytest.raises(ValueError, match="expected bytes, e.g. 4GiB, 512MiB or 1000000|negative size"):
        parse_bytes(text)


@pytest.mark.parametrize(("value", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (4 << 30, "4 GiB"),
    (3 * 2**29, "1.5 GiB"), (5 * 2**40, "5 TiB"), (2**50, "1024 TiB"),
])
def test_format_bytes(value, text) -> None:
    assert format_bytes(value) == text
    assert parse_bytes(text.replace(" ", "")) == value
