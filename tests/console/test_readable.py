"""Numbers rounded for reading in the admin's tables (`{% load readable %}`); JSON keeps every
digit."""

from __future__ import annotations

import pytest

from console.templatetags.readable import readable_beside, readable_number, usd


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


@pytest.mark.parametrize(
    ("value", "other", "shown"),
    [
        ("1.0475550912799085", "1", "1.05"),
        ("0.3333333333333333", "0.5", "0.333"),
        ("12345.678901", "12000", "12,346"),
        # Rounded, the two would read the same while they differ: written whole.
        ("0.33334", "0.33333", "0.33334"),
        ("0.5", "0.5", "0.5"),
        ("6000", "2400", "6000"),
        ("unlimited", "4", "unlimited"),
        ("1e-07", "0", "1e-07"),
    ],
)
def test_limits_written_as_text_read_rounded_unless_that_hides_a_change(value, other, shown):
    assert readable_beside(value, other) == shown
