"""Canonical JSON: RFC 8785 (the JSON Canonicalization Scheme), with JavaScript's number rules.

Keys are sorted by UTF-16 code units, there is no whitespace, non-ASCII text is kept as UTF-8,
strings are escaped as ``JSON.stringify`` escapes them and numbers are written as JavaScript's
``Number.prototype.toString`` writes them, so digests agree across languages. Where RFC 8785
implementations refuse input, this one does what JavaScript does: an integer beyond 2**53 is
written as the nearest double, and a lone surrogate is written as a ``\\u`` escape. A test
cross-checks random documents against the independent ``rfc8785`` package.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "sha256_digest"]

# Integers up to 2**53 are exact doubles whose shortest decimal form is the integer itself.
_EXACT_INT_LIMIT = 2**53

_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``.

    Accepts mappings with string keys, lists and tuples, strings, bools, ``None``, ints and
    floats. Raises ``ValueError`` for NaN, infinities and integers too large for a double, and
    ``TypeError`` for any other type or a non-string key.
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def sha256_digest(value: Any) -> str:
    """Return ``"sha256:" + hex(sha256(canonical_json(value) as UTF-8))``."""
    text = canonical_json(value)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _write(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, int):
        parts.append(_integer(value))
    elif isinstance(value, float):
        parts.append(_double(value))
    elif isinstance(value, Mapping):
        _write_object(value, parts)
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        raise TypeError(f"canonical_json cannot encode {type(value).__name__}")


def _write_object(value: Mapping[Any, Any], parts: list[str]) -> None:
    keyed: list[tuple[bytes, str, Any]] = []
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"canonical_json needs string keys, got {type(key).__name__}")
        text = _join_surrogates(key)
        keyed.append((text.encode("utf-16-be", "surrogatepass"), text, item))
    # Big-endian UTF-16 bytes compare exactly as JavaScript compares code units.
    keyed.sort(key=lambda entry: entry[0])
    parts.append("{")
    for index, (units, key, item) in enumerate(keyed):
        if index:
            if units == keyed[index - 1][0]:
                # A surrogate pair spelled as two code points and the character it makes: two
                # keys in Python, one in JSON, and no order between them to write.
                raise ValueError(f"canonical_json keys {key!r} name the same JSON string twice")
            parts.append(",")
        parts.append(_string(key))
        parts.append(":")
        _write(item, parts)
    parts.append("}")


def _join_surrogates(text: str) -> str:
    if _SURROGATE.search(text) is None:
        return text
    # A high/low pair spelled as two code points is one character in JavaScript.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    return f"\\u{ord(char):04x}"


def _string(text: str) -> str:
    text = _join_surrogates(text)
    return '"' + _NEEDS_ESCAPE.sub(_escape, text) + '"'


def _integer(number: int) -> str:
    if -_EXACT_INT_LIMIT <= number <= _EXACT_INT_LIMIT:
        return str(int(number))
    try:
        as_double = float(number)
    except OverflowError:
        raise ValueError("canonical_json cannot encode an integer this large") from None
    return _double(as_double)


def _double(number: float) -> str:
    if not math.isfinite(number):
        raise ValueError(f"canonical_json cannot encode {number!r}")
    if number == 0:
        return "0"
    if number < 0:
        return "-" + _double(-number)
    mantissa, _, exponent_text = repr(number).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    # point = n of ECMA-262 Number::toString: the value is 0.digits * 10**point.
    point = len(whole) + (int(exponent_text) if exponent_text else 0)
    significant = digits.lstrip("0")
    point -= len(digits) - len(significant)
    digits = significant.rstrip("0")
    count = len(digits)
    if count <= point <= 21:
        return digits + "0" * (point - count)
    if 0 < point <= 21:
        return digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    exponent = point - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits[0] if count == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(exponent)}"
