"""JSON from outside the deployment, checked before and after parsing.

Before: a nesting bound, so a deeply nested document is refused without recursing into it. The
bound is found in time linear in the text's length (two regular-expression passes that never
backtrack, then a running sum in C), whatever the text holds: an unclosed string or a run of
escaped quotes costs what any other text of its length costs.
After: every string and key free of NUL and lone surrogates (PostgreSQL cannot store them) and
every number finite (canonical JSON and the digests cannot write NaN or infinity).
Plain Python, used by the API's parser and by the admin's JSON forms alike.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from itertools import accumulate
from typing import Any

__all__ = ["UntrustedJSONError", "check_json_value", "load_untrusted_json", "nesting_depth"]

# A string runs to its closing quote, or to the end of the text when it is never closed: the match
# always succeeds from an opening quote and is possessive, so no position is scanned twice.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
# Openers step the depth up by one and closers down by one, as signed bytes.
_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class UntrustedJSONError(ValueError):
    """The document cannot be accepted; `path` names the value at fault ("" for the whole)."""

    def __init__(self, problem: str, *, path: str = "") -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path


def load_untrusted_json(text: str | bytes, *, max_depth: int) -> Any:
    """Parse `text` (UTF-8 when bytes) and check it; raises `UntrustedJSONError`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UntrustedJSONError(f"is not UTF-8 (byte {error.start})") from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise UntrustedJSONError(f"is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except ValueError as error:
        if isinstance(error, json.JSONDecodeError):
            where = f" (line {error.lineno}, column {error.colno})"
            raise UntrustedJSONError(f"not valid JSON: {error.msg}{where}") from None
        raise UntrustedJSONError(f"not valid JSON: {error}") from None
    check_json_value(value)
    return value


def check_json_value(value: Any, path: str = "") -> None:
    """Refuse NUL, lone surrogates and non-finite numbers anywhere in a parsed JSON value."""
    if isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UntrustedJSONError("must be a finite number", path=path or "document")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            _check_text(str(key), where)
            check_json_value(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json_value(item, f"{path}[{index}]")


def _check_text(text: str, path: str) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    what = "a NUL character" if found.group() == "\x00" else "a lone surrogate (not Unicode text)"
    raise UntrustedJSONError(f"contains {what}", path=_printable_path(path) or "document")


def _printable_path(path: str) -> str:
    # The path names a key that may itself hold the bad character; show it escaped.
    return _UNSTORABLE.sub(lambda match: f"\\u{ord(match.group()):04x}", path)


def nesting_depth(text: str) -> int:
    """How deeply `text` nests arrays and objects (exact for valid JSON), in linear time."""
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text))
    steps = array("b", skeleton.translate(_STEPS).encode("latin-1"))
    return max(accumulate(steps), default=0)
