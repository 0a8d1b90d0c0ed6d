"""`{% load readable %}`: numbers rounded for reading in the admin's tables (JSON keeps every
digit). `readable` gives integers thousands separators and other numbers three significant
digits (`72.217` → `72.2`, `1.0475550912799085` → `1.05`); `usd` writes an amount of money;
`readable_beside` rounds a number written as text (a limit) unless it would then read as the
value it is shown beside while it differs from it."""

from __future__ import annotations

import math
import re
from typing import Any

from django import template

register = template.Library()


def readable_number(value: Any) -> str:
    """The number as a person reads it; anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:,.3g}" if magnitude < 10 else f"{value:,.1f}"
    return f"{value:.3g}"


@register.filter
def readable(value: Any) -> str:
    return readable_number(value)


_NUMBER_TEXT = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def _number(text: Any) -> int | float | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return text
    if not isinstance(text, str) or not _NUMBER_TEXT.fullmatch(text):
        return None
    return int(text) if text.lstrip("-").isdigit() else float(text)


@register.filter
def readable_beside(value: Any, other: Any) -> str:
    """`value` (a number, or a number written as text) rounded for reading; written whole when
    rounding would make it read as `other` while the two differ. Whole numbers and anything
    else stay as they are."""
    number = _number(value)
    if number is None or isinstance(number, int) or float(number).is_integer():
        return "" if value is None else str(value)
    text = readable_number(number)
    theirs = _number(other)
    if theirs is not None and theirs != number and readable_number(theirs) == text:
        return str(value)
    return text


@register.filter
def usd(value: Any) -> str:
    """`$1,234.57`, `$0.0042`: cents for amounts of a dollar or more, else three significant
    digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.3g}"
