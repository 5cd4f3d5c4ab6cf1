"""rapidjson's Reader as TF Serving uses it: grammar, error texts and byte offsets.

``parse(data)`` parses a request body as TF Serving does (rapidjson 1.1.0 with
kParseIterativeFlag | kParseNanAndInfFlag | kParseStopWhenDoneFlag) and raises
``ParseError`` with rapidjson's text and offset. ``json_type`` names a parsed value's
type as rapidjson does ("Null", "Object", "Number", ...). json_tensor.py turns these
into TF Serving's errors; the writer is rapidjson_writer.py.

The parser is python-rapidjson, which wraps the C++ rapidjson: its grammar, native
number handling (int64, uint64, else a double; no full-precision flag, as in TF
Serving) and GetParseError_En texts and offsets are the real thing. Two cases it
cannot take, and the hand-written iterative ``Parser`` below parses instead, with the
same grammar and texts:

* nesting deeper than the Python recursion limit: python-rapidjson parses
  recursively and stops ("Maximum parse recursion depth exceeded!"), where TF
  Serving's iterative parse has no limit (json_tensor_test.cc DeeplyNestedWellFormed);
* bytes that are not UTF-8: python-rapidjson decodes its input as UTF-8 first, where
  TF Serving's rapidjson does not validate the encoding and passes the bytes through.

One difference from rapidjson 1.1.0 remains, in python-rapidjson's newer rapidjson:
a lone low-surrogate escape ("\\udc00") is "The surrogate pair in string is
invalid." where 1.1.0 accepts it. Repeated object keys: the last one wins (rapidjson
keeps both members and a lookup finds the first).
"""

from __future__ import annotations

import math
import re
from typing import Any

import rapidjson

_INT64 = (-(2**63), 2**63)
_UINT64 = (0, 2**64)


def json_type(value: Any) -> str:
    """rapidjson's type name of a parsed value, as TF Serving's messages print it."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


class ParseError(Exception):
    """rapidjson's parse error: its text and the byte offset where parsing stopped."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message, self.offset = message, offset


_EMPTY = "The document is empty."
_INVALID = "Invalid value."
_MISS_NAME = "Missing a name for object member."
_MISS_COLON = "Missing a colon after a name of object member."
_MISS_CURLY = "Missing a comma or '}' after an object member."
_MISS_SQUARE = "Missing a comma or ']' after an array element."
_BAD_HEX = "Incorrect hex digit after \\u escape in string."
_BAD_SURROGATE = "The surrogate pair in string is invalid."
_BAD_ESCAPE = "Invalid escape character in string."
_MISS_QUOTE = "Missing a closing quotation mark in string."
_BAD_ENCODING = "Invalid encoding in string."
_TOO_BIG = "Number too big to be stored in double."
_MISS_FRACTION = "Miss fraction part in number."
_MISS_EXPONENT = "Miss exponent in number."

# python-rapidjson: "Parse error at offset 12: Invalid value."
_LIBRARY_ERROR = re.compile(r"Parse error at offset (\d+): (.*)", re.S)
_NOT_DONE = "The document root must not be followed by other values."
_NATIVE = rapidjson.NM_NAN | rapidjson.NM_NATIVE


def parse(data: bytes) -> Any:
    """A document as TF Serving's rapidjson reads it, or ``ParseError``."""
    end = data.find(b"\0")  # rapidjson reads a C string: the document ends at the first NUL
    if end >= 0:
        data = data[:end]
    try:
        return rapidjson.loads(data, number_mode=_NATIVE)
    except (UnicodeDecodeError, RecursionError):  # not UTF-8, or nested too deep
        return Parser(data).parse()
    except rapidjson.JSONDecodeError as exc:
        match = _LIBRARY_ERROR.fullmatch(str(exc))
        if match is None:  # not one of rapidjson's texts: let the parser judge
            return Parser(data).parse()
        offset, message = int(match.group(1)), match.group(2)
    if message == _NOT_DONE:  # kParseStopWhenDoneFlag: what follows the root is ignored
        return parse(data[:offset])
    raise ParseError(message, offset)


_WS = b" \t\n\r"
_SIMPLE_ESCAPES = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b",
                   ord("f"): "\f", ord("n"): "\n", ord("r"): "\r", ord("t"): "\t"}
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]*)?")


class Parser:
    """Iterative parser with rapidjson's grammar, error texts and byte offsets: for the
    documents python-rapidjson cannot read (see the module docstring)."""

    def __init__(self, data: bytes) -> None:
        end = data.find(b"\0")  # rapidjson's stream ends at the first NUL
        self.data = data if end < 0 else data[:end]
        self.pos = 0

    def _ws(self) -> int:
        data, pos = self.data, self.pos
        while pos < len(data) and data[pos] in _WS:
            pos += 1
        self.pos = pos
        return data[pos] if pos < len(data) else -1

    def parse(self) -> Any:
        if self._ws() < 0:
            raise ParseError(_EMPTY, self.pos)
        stack: list[list] = []  # ["a", list] or ["o", dict, pending key]
        while True:
            value, opened = self._value(stack)
            if opened:
                continue
            while True:  # attach the finished value to its parent
                if not stack:
                    return value
                top = stack[-1]
                if top[0] == "a":
                    top[1].append(value)
                    char = self._ws()
                    if char == ord(","):
                        self.pos += 1
                        self._ws()
                        break
                    if char != ord("]"):
                        raise ParseError(_MISS_SQUARE, self.pos)
                else:
                    top[1].setdefault(top[2], value)
                    char = self._ws()
                    if char == ord(","):
                        self.pos += 1
                        top[2] = self._member_name()
                        break
                    if char != ord("}"):
                        raise ParseError(_MISS_CURLY, self.pos)
                self.pos += 1
                value = stack.pop()[1]

    def _member_name(self) -> str:
        if self._ws() != ord('"'):
            raise ParseError(_MISS_NAME, self.pos)
        name = self._string()
        if self._ws() != ord(":"):
            raise ParseError(_MISS_COLON, self.pos)
        self.pos += 1
        self._ws()
        return name

    def _value(self, stack: list[list]) -> tuple[Any, bool]:
        """Parse a scalar, or open a container (returns opened=True)."""
        data, pos = self.data, self.pos
        char = data[pos] if pos < len(data) else -1
        if char == ord("{"):
            self.pos += 1
            if self._ws() == ord("}"):
                self.pos += 1
                return {}, False
            stack.append(["o", {}, self._member_name()])
            return None, True
        if char == ord("["):
            self.pos += 1
            if self._ws() == ord("]"):
                self.pos += 1
                return [], False
            stack.append(["a", []])
            return None, True
        if char == ord('"'):
            return self._string(), False
        for literal, result in ((b"null", None), (b"true", True), (b"false", False)):
            if char == literal[0]:
                self.pos = self._expect(pos, literal)
                return result, False
        if char < 0:
            raise ParseError(_INVALID, pos)
        return self._number(), False

    def _number(self) -> Any:
        data, start = self.data, self.pos
        pos = start + (data[start:start + 1] == b"-")
        if data[pos:pos + 1] in (b"N", b"I"):
            return self._nan_or_inf(pos, negative=pos > start)
        match = _NUMBER.match(data, start)
        if match is None:
            raise ParseError(_INVALID, pos)
        frac, exp = match.group(1), match.group(2)
        if frac is not None and len(frac) == 1:
            raise ParseError(_MISS_FRACTION, match.start(1) + 1)
        if exp is not None and not exp.lstrip(b"eE+-"):
            raise ParseError(_MISS_EXPONENT, match.end(2))
        self.pos = match.end()
        text = match.group()
        if frac is None and exp is None:
            number = int(text)
            if _INT64[0] <= number < _UINT64[1]:
                return number
        if exp is not None and exp[1:2] != b"-":  # rapidjson's bound on the exponent
            if int(exp.lstrip(b"eE+")) > 308 + (len(frac) - 1 if frac else 0):
                raise ParseError(_TOO_BIG, start)
        number = float(text)  # rapidjson stores wider integers as doubles too
        if math.isinf(number):
            raise ParseError(_TOO_BIG, start)
        return number

    def _nan_or_inf(self, pos: int, negative: bool) -> float:
        word = b"NaN" if self.data[pos:pos + 1] == b"N" else b"Inf"
        pos = self._expect(pos, word)
        if word == b"Inf" and self.data[pos:pos + 1] == b"i":
            pos = self._expect(pos, b"inity")
        self.pos = pos
        value = math.nan if word == b"NaN" else math.inf
        return -value if negative else value

    def _expect(self, pos: int, word: bytes) -> int:
        """Consume ``word`` at ``pos`` or fail where it stops matching."""
        n = 0
        while n < len(word) and self.data[pos + n:pos + n + 1] == word[n:n + 1]:
            n += 1
        if n < len(word):
            raise ParseError(_INVALID, pos + n)
        return pos + n

    def _string(self) -> str:
        data, pos = self.data, self.pos + 1
        chunks: list[str] = []
        run = pos
        while True:
            if pos >= len(data):
                raise ParseError(_MISS_QUOTE, pos)
            char = data[pos]
            if char == ord('"'):
                chunks.append(data[run:pos].decode("utf-8", "surrogateescape"))
                self.pos = pos + 1
                return "".join(chunks)
            if char < 0x20:
                raise ParseError(_BAD_ENCODING, pos)
            if char != ord("\\"):
                pos += 1
                continue
            chunks.append(data[run:pos].decode("utf-8", "surrogateescape"))
            escape = data[pos + 1] if pos + 1 < len(data) else -1
            if escape in _SIMPLE_ESCAPES:
                chunks.append(_SIMPLE_ESCAPES[escape])
                pos += 2
            elif escape == ord("u"):
                code = self._hex4(pos + 2, pos)
                end = pos + 6
                if 0xD800 <= code <= 0xDBFF:
                    if data[end:end + 2] != b"\\u":
                        raise ParseError(_BAD_SURROGATE, pos)
                    low = self._hex4(end + 2, pos)
                    if not 0xDC00 <= low <= 0xDFFF:
                        raise ParseError(_BAD_SURROGATE, pos)
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    end += 6
                chunks.append(chr(code))
                pos = end
            else:
                raise ParseError(_BAD_ESCAPE, pos)
            run = pos

    def _hex4(self, at: int, escape_offset: int) -> int:
        digits = self.data[at:at + 4]
        if len(digits) < 4 or not all(c in b"0123456789abcdefABCDEF" for c in digits):
            raise ParseError(_BAD_HEX, escape_offset)
        return int(digits, 16)
