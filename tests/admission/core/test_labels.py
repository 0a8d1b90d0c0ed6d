"""Finding 9 (labels): profile labels, provider ids and principal ids are printable text a
person can tell apart, never blank, padded, invisible-character or unbounded."""

from __future__ import annotations

import copy

import pytest

from admission.core import InvalidProfileError, Profile
from admission.core.labels import MAX_LABEL_LENGTH, label_problem

DOCUMENT = {
    "profileVersion": "v1",
    "workspace": {"concurrency": 2},
    "providers": {"fake": {"concurrency": 2}},
    "principals": {"alice": {"concurrency": 1}},
}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("demo-v1\u200b", "U+200B"),
        ("\u202edemo", "U+202E"),
        ("demo\u2066v1", "U+2066"),
        ("a\u00a0b", "U+00A0"),
        ("nul\x00", "U+0000"),
        ("lone\ud800", "U+D800"),
        ("tab\tbed", "U+0009"),
        ("   ", "only whitespace"),
        (" v1", "start or end with whitespace"),
        ("", "non-empty string"),
        (7, "non-empty string"),
        ("x" * (MAX_LABEL_LENGTH + 1), f"at most {MAX_LABEL_LENGTH}"),
    ],
)
def test_unreadable_labels_are_refused(value, problem):
    assert problem in (label_problem(value) or "")


@pytest.mark.parametrize("value", ["demo-v1", "v 2 (canary)", "Zürich-é", "x" * MAX_LABEL_LENGTH])
def test_readable_labels_pass(value):
    assert label_problem(value) is None


@pytest.mark.parametrize(
    ("place", "field"),
    [
        ("profileVersion", "profileVersion"),
        ("provider", "providers.'fake\\u200b'"),
        ("principal", "principals.'alice\\u200b'"),
    ],
)
def test_the_profile_parser_names_the_unreadable_id(place, field):
    document = copy.deepcopy(DOCUMENT)
    if place == "profileVersion":
        document["profileVersion"] = "v1\u200b"
    elif place == "provider":
        document["providers"] = {"fake\u200b": {"concurrency": 2}}
    else:
        document["principals"] = {"alice\u200b": {"concurrency": 1}}
    with pytest.raises(InvalidProfileError) as caught:
        Profile.from_dict(document, workspace_id="acme")
    assert str(caught.value).startswith(f"{field}: ")
    assert "U+200B" in str(caught.value)
