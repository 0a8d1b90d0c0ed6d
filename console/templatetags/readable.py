"""`{% load readable %}`: numbers rounded for reading in the admin's tables (JSON keeps every
digit). `readable` gives integers thousands separators and other numbers three significant
digits (`72.217` → `72.2`, `1.0475550912799085` → `1.05`); `usd` writes an amount of money."""

from __future__ import annotations

import math
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
