"""Canonical JSON is RFC 8785 (JCS): a cross-check against the independent `rfc8785` package.

A development-only check (`rfc8785` is a dev dependency; the project never imports it). The two
differ only where RFC 8785 leaves JavaScript's rules behind, and both differences are ours on
purpose: an integer beyond 2**53 is written as the double JavaScript would read it (the package
refuses it), and a lone surrogate is escaped as `JSON.stringify` escapes it (the package refuses
text that is not UTF-8).
"""

from __future__ import annotations

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.core.canonical import canonical_json

from .conftest import examples

SAFE = 2**53 - 1
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-SAFE, SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=examples(500), deadline=None)
@given(documents)
def test_canonical_json_agrees_with_rfc8785_on_random_documents(document):
    assert canonical_json(document).encode("utf-8") == rfc8785.dumps(document)


def test_the_documented_differences():
    # Beyond 2**53 JavaScript has only the nearest double; RFC 8785 implementations refuse.
    assert canonical_json(2**60) == "1152921504606847000"
    assert canonical_json(2**53 + 1) == "9007199254740992"
    # A lone surrogate is escaped as JSON.stringify escapes it; a pair is one character.
    assert canonical_json("\ud800") == '"\\ud800"'
    assert canonical_json("a\ud83d\ude00") == '"a\U0001f600"'
    for value in (2**60, "\ud800"):
        try:
            rfc8785.dumps(value)
        except Exception as refused:  # the package's own error types
            assert type(refused).__module__.startswith("rfc8785")
        else:
            raise AssertionError(f"rfc8785 accepted {value!r}")
