"""rapidjson's Writer as TF Serving uses it: the PrettyWriter, doubles, debug strings.

* ``PrettyWriter`` is rapidjson's PrettyWriter byte for byte (json_response.py writes
  TF Serving's REST responses with it); ``quote`` its string escaping.
* ``format_double`` is its Writer::Double (Grisu shortest digits, then Prettify).
* ``debug_string`` is TF Serving's JsonValueToDebugString (single-line arrays, cut
  after 256 bytes), which its error texts quote.

The parser is rapidjson_reader.py. No TF Serving errors here.
"""

from __future__ import annotations

import math
from typing import Any

_DEBUG_LIMIT = 256  # kMaxJsonDebugStringBytes
_INT64 = (-(2**63), 2**63)
_UINT64 = (0, 2**64)


class _Stop(Exception):
    """The debug writer hit its size limit or a value rapidjson cannot write."""


_ESCAPES = {i: f"\\u{i:04X}" for i in range(0x20)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r",
                 0x22: '\\"', 0x5C: "\\\\"})


def quote(text: str) -> str:
    """A JSON string literal as rapidjson writes it (control characters as \\u00XX)."""
    return '"' + text.translate(_ESCAPES) + '"'


class PrettyWriter:
    """rapidjson's PrettyWriter: 4-space indent, optional single-line arrays."""

    def __init__(self, limit: int | None = None) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.levels: list[list] = []  # [in_array, value_count]
        self.single_line_arrays = False
        self.limit = limit

    def text(self) -> str:
        return "".join(self.parts)

    def _put(self, s: str) -> None:
        self.parts.append(s)
        self.size += len(s)

    def _check(self) -> None:
        if self.limit is not None and self.size >= self.limit:
            raise _Stop

    def _prefix(self) -> None:
        if not self.levels:
            return
        level = self.levels[-1]
        if level[0]:
            if level[1] > 0:
                self._put(", " if self.single_line_arrays else ",")
            if not self.single_line_arrays:
                self._put("\n" + "    " * len(self.levels))
        else:
            if level[1] > 0:
                self._put(",\n" if level[1] % 2 == 0 else ": ")
            else:
                self._put("\n")
            if level[1] % 2 == 0:
                self._put("    " * len(self.levels))
        level[1] += 1

    def raw(self, token: str) -> None:
        self._check()
        self._prefix()
        self._put(token)

    def string(self, value: str) -> None:
        self.raw(quote(value))

    key = string

    def start_object(self) -> None:
        self.raw("{")
        self.levels.append([False, 0])

    def end_object(self) -> None:
        self._check()
        if self.levels.pop()[1]:
            self._put("\n" + "    " * len(self.levels))
        self._put("}")

    def start_array(self) -> None:
        self.raw("[")
        self.levels.append([True, 0])

    def end_array(self) -> None:
        self._check()
        if self.levels.pop()[1] and not self.single_line_arrays:
            self._put("\n" + "    " * len(self.levels))
        self._put("]")

    def scalars(self, tokens: list[str]) -> None:
        """An array of raw scalar tokens: start_array, raw(t) for each, end_array."""
        if self.limit is not None or not tokens:
            self.start_array()
            for token in tokens:
                self.raw(token)
            self.end_array()
            return
        self.raw("[")
        if self.single_line_arrays:
            self._put(", ".join(tokens))
            self._put("]")
        else:
            indent = "\n" + "    " * (len(self.levels) + 1)
            self._put(indent + ("," + indent).join(tokens))
            self._put("\n" + "    " * len(self.levels) + "]")


def format_double(value: float) -> str:
    """rapidjson's Writer::Double (Grisu shortest digits, then Prettify)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    k = int(exp or 0) - len(frac)
    stripped = digits.rstrip("0")
    k += len(digits) - len(stripped)
    digits, length = stripped, len(stripped)
    kk = length + k
    if 0 <= k and kk <= 21:
        text = digits + "0" * k + ".0"
    elif 0 < kk <= 21:
        text = digits[:kk] + "." + digits[kk:]
    elif -6 < kk <= 0:
        text = "0." + "0" * -kk + digits
    elif length == 1:
        text = f"{digits}e{kk - 1}"
    else:
        text = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + text


def _write_value(writer: PrettyWriter, value: Any) -> None:
    """rapidjson Value::Accept for a parsed document (used for debug strings)."""
    if isinstance(value, dict):
        writer.start_object()
        for name, item in value.items():
            writer.key(name)
            _write_value(writer, item)
        writer.end_object()
    elif isinstance(value, list):
        writer.start_array()
        for item in value:
            _write_value(writer, item)
        writer.end_array()
    elif isinstance(value, str):
        writer.string(value)
    elif value is None or isinstance(value, bool):
        writer.raw({None: "null", True: "true", False: "false"}[value])
    elif isinstance(value, int) and _INT64[0] <= value < _UINT64[1]:
        writer.raw(str(value))
    elif math.isfinite(value):
        writer.raw(format_double(float(value)))
    else:
        writer.raw("")  # Writer::Double refuses NaN/Inf after writing the separator
        raise _Stop


def debug_string(value: Any) -> str:
    """JsonValueToDebugString: single-line arrays, cut after 256 bytes."""
    writer = PrettyWriter(limit=_DEBUG_LIMIT)
    writer.single_line_arrays = True
    try:
        _write_value(writer, value)
    except (_Stop, RecursionError):
        pass
    return writer.text()
