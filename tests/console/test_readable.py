"""Numbers rounded for reading in the admin's tables (`{% load readable %}`); JSON keeps every
digit."""

from __future__ import annotations

import pytest

from console.templatetags.readable import readable_number, usd


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (72.217, "72.2"),
        (1.0475550912799085, "1.05"),
        (0.000123456, "0.000123"),
        (1234567, "1,234,567"),
        (1234.5678, "1,235"),
        (3.0, "3"),
        (0, "0"),
        (-2.345, "-2.35"),
        (True, "True"),
        ("—", "—"),
        (None, ""),
        (float("inf"), "inf"),
    ],
)
def test_numbers_read_rounded(value, shown):
    assert readable_number(value) == shown


def test_money_reads_in_cents_or_three_digits():
    assert (usd(1234.567), usd(0.0041629), usd(0), usd(None)) == ("$1,234.57", "$0.00416", "$0", "")
