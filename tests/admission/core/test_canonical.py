import hashlib
import json
import math
import random
import shutil
import struct
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.core.canonical import canonical_json, sha256_digest


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, "1"),
        (1.0, "1"),
        (0, "0"),
        (-0.0, "0"),
        (0.5, "0.5"),
        (-1.5, "-1.5"),
        (123.456, "123.456"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.2345678901234568e20, "123456789012345680000"),
        (1.23e27, "1.23e+27"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-10, "1.5e-10"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**53, "9007199254740992"),
        (-(2**53), "-9007199254740992"),
        (2**60, "1152921504606847000"),
        (10**21, "1e+21"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
    ],
)
def test_scalars_are_written_as_javascript_writes_them(value, expected):
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, [1, math.nan]])
def test_non_finite_numbers_raise_value_error(value):
    with pytest.raises(ValueError):
        canonical_json(value)


def test_keys_are_sorted_by_utf16_code_units_without_whitespace():
    value = {"b": 1, "\uff61": 2, "\U0001f600": 3, "B": 4, "a": {"y": [], "x": {}}}
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+FF61 in UTF-16.
    assert canonical_json(value) == '{"B":4,"a":{"x":{},"y":[]},"b":1,"\U0001f600":3,"\uff61":2}'


def test_strings_are_escaped_as_json_stringify_escapes_them():
    text = 'q"b\\\b\f\n\r\t\x00\x1f\x7f\u2028é\U0001f600'
    expected = '"q\\"b\\\\\\b\\f\\n\\r\\t\\u0000\\u001f\x7f\u2028é\U0001f600"'
    assert canonical_json(text) == expected


def test_lone_surrogates_are_escaped_and_pairs_are_joined():
    assert canonical_json("a\ud800b\udfff") == '"a\\ud800b\\udfff"'
    assert canonical_json("\ud83d\ude00") == '"\U0001f600"'


def test_tuples_are_arrays_and_mappings_of_any_kind_are_objects():
    from types import MappingProxyType

    assert canonical_json(MappingProxyType({"k": (1, 2.5)})) == '{"k":[1,2.5]}'


@pytest.mark.parametrize("value", [{1: "x"}, {None: 1}, {1, 2}, b"bytes", object()])
def test_unsupported_values_raise_type_error(value):
    with pytest.raises(TypeError):
        canonical_json(value)


def test_sha256_digest_hashes_the_utf8_canonical_text():
    value = {"é": 1.0, "a": [True]}
    text = '{"a":[true],"é":1}'
    assert canonical_json(value) == text
    assert sha256_digest(value) == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


def _as_doubles(value):
    # JSON numbers are doubles, so 1 and 1.0 (and big ints and their nearest double) are one value.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    return [_as_doubles(item) for item in value]


@given(json_values)
def test_canonical_text_parses_back_to_an_equal_value(value):
    text = canonical_json(value)
    assert _as_doubles(json.loads(text)) == _as_doubles(value)
    assert canonical_json(json.loads(text)) == text


@given(st.dictionaries(st.text(), st.integers(), max_size=8), st.randoms())
def test_key_insertion_order_does_not_change_the_text(value, rnd):
    items = list(value.items())
    rnd.shuffle(items)
    assert canonical_json(dict(items)) == canonical_json(value)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_numbers_and_key_order_agree_with_node():
    rng = random.Random(2601)
    numbers = []
    while len(numbers) < 3000:
        bits = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(bits):
            numbers.append(bits)
    numbers += [rng.randint(0, 10**6) / 10 ** rng.randint(0, 12) for _ in range(1000)]
    numbers += [10.0**k for k in range(-25, 25)]
    document = {"numbers": numbers, "keys": {"b": 1, "\uff61": 2, "\U0001f600": 3, "B": 4}}
    script = (
        "const d=JSON.parse(require('fs').readFileSync(0,'utf8'));"
        "const k=Object.keys(d.keys).sort().map(x=>JSON.stringify(x)+':'+d.keys[x]).join(',');"
        "process.stdout.write('{\"keys\":{'+k+'},\"numbers\":'+JSON.stringify(d.numbers)+'}');"
    )
    result = subprocess.run(
        ["node", "-e", script],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout == canonical_json(document)
