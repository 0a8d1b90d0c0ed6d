"""Canonical JSON at its edges: refusals and their messages, keys that are not plain text, and
RFC 8785's number forms around the boundaries of JavaScript's `Number.prototype.toString`."""

from __future__ import annotations

import hashlib
import math

import pytest

from admission.core.canonical import canonical_json, sha256_digest


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (math.inf, "canonical_json cannot encode inf"),
        (-math.inf, "canonical_json cannot encode -inf"),
        (math.nan, "canonical_json cannot encode nan"),
        ({"deep": [1, {"x": math.nan}]}, "canonical_json cannot encode nan"),
        (10**400, "canonical_json cannot encode an integer this large"),
        (-(10**400), "canonical_json cannot encode an integer this large"),
    ],
)
def test_unencodable_numbers_are_refused_with_a_message(value, message):
    with pytest.raises(ValueError) as raised:
        canonical_json(value)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, "canonical_json cannot encode set"),
        (b"raw", "canonical_json cannot encode bytes"),
        ({"k": [object()]}, "canonical_json cannot encode object"),
        ({1: "x"}, "canonical_json needs string keys, got int"),
        ({"ok": {None: 1}}, "canonical_json needs string keys, got NoneType"),
    ],
)
def test_unsupported_values_are_refused_with_their_type_named(value, message):
    with pytest.raises(TypeError) as raised:
        canonical_json(value)
    assert str(raised.value) == message


def test_keys_with_lone_surrogates_are_sorted_by_code_unit_and_escaped():
    pairs = [("\udc00", 1), ("\uffff", 2), ("a", 3), ("\ud800", 4), ("\ud83d\ude00z", 5)]
    value = dict(pairs)
    assert len(value) == 5
    # Code units: a (0061) < D800 < D83D DE00 (the joined pair) < DC00 < FFFF.
    assert canonical_json(value) == ('{"a":3,"\\ud800":4,"\U0001f600z":5,"\\udc00":1,"\uffff":2}')


def test_a_key_spelled_as_a_surrogate_pair_sorts_as_its_character():
    # U+E000 is one code unit E000; the pair D83D DE00 sorts before it, as in JavaScript.
    assert canonical_json({"\ue000": 1, "\ud83d\ude00": 2}) == '{"\U0001f600":2,"\ue000":1}'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # Negative zero is written as 0, also inside containers and as a negative exponent form.
        (-0.0, "0"),
        ([-0.0, 0.0], "[0,0]"),
        (-1e-7, "-1e-7"),
        (-1e21, "-1e+21"),
        (-123.5, "-123.5"),
        # The switch from plain digits to exponent form happens at 1e21 and below 1e-6.
        (999999999999999900000.0, "999999999999999900000"),
        (1.5e21, "1.5e+21"),
        (1.25e-6, "0.00000125"),
        (9.5e-7, "9.5e-7"),
        (0.000123, "0.000123"),
        (1.0001, "1.0001"),
        (100.0, "100"),
        (1e16, "10000000000000000"),
        (123e18, "123000000000000000000"),
        (2.5e-300, "2.5e-300"),
        (4.35e100, "4.35e+100"),
        # Integers are exact up to 2**53 in magnitude and the nearest double beyond.
        (2**53 - 1, "9007199254740991"),
        (-(2**53) + 1, "-9007199254740991"),
        (2**53 + 2, "9007199254740994"),
        (-(2**53) - 1, "-9007199254740992"),
        (10**20, "100000000000000000000"),
        (10**21 + 1, "1e+21"),
        (-(10**22), "-1e+22"),
        (2**1024 - 2**971, "1.7976931348623157e+308"),
    ],
)
def test_number_forms_follow_javascript(value, expected):
    assert canonical_json(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x07\x0b\x1b", '"\\u0007\\u000b\\u001b"'),
        ("\x7f\x80\u00ff", '"\x7f\x80\u00ff"'),
        ("/</script>", '"/</script>"'),
        ("\u2028\u2029", '"\u2028\u2029"'),
        ("\udfff\ud800", '"\\udfff\\ud800"'),
        ("\ud83d", '"\\ud83d"'),
    ],
)
def test_strings_escape_only_what_json_stringify_escapes(text, expected):
    assert canonical_json(text) == expected


def test_a_digest_is_of_the_utf8_bytes_of_the_canonical_text():
    value = {"z": "\u00e9\U0001f600", "a": [1.5, None]}
    text = '{"a":[1.5,null],"z":"\u00e9\U0001f600"}'
    assert canonical_json(value) == text
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert sha256_digest(value) == f"sha256:{expected}"


def test_two_keys_that_are_one_json_string_are_refused_whatever_their_order():
    pair, character = "\ud83d\ude00", "\U0001f600"
    for document in ({pair: 1, character: 2}, {character: 2, pair: 1}):
        with pytest.raises(ValueError, match="same JSON string"):
            canonical_json(document)
