"""Every problem of a profile document at once (admission/services/profile_problems.py): the
same core rules, each problem naming its field, nothing reported for a valid document."""

from __future__ import annotations

import copy

import pytest

from admission.core import InvalidProfileError, Profile
from admission.services.profile_problems import InvalidProfileDocument, profile_problems

VALID = {
    "profileVersion": "v1",
    "workspace": {"concurrency": 4, "maxQueueLength": 8},
    "providers": {"llm": {"concurrency": 2, "circuitBreaker": {"failureThreshold": 3}}},
    "principals": [
        {"id": "pat", "class": "gold", "limits": {"concurrency": 2, "reservedConcurrency": 1}},
        {"id": "alex", "limits": {"concurrency": 1}},
    ],
}


def problems(doc):
    return [(p.field, p.problem) for p in profile_problems(doc, workspace_id="acme")]


def test_a_valid_document_has_no_problem(manifest_profile):
    assert problems(VALID) == []
    assert problems(manifest_profile) == []


def test_three_problems_in_three_places_are_all_named():
    doc = copy.deepcopy(VALID)
    doc["workspace"]["concurrency"] = 0
    doc["providers"]["llm"]["circuitBreaker"]["failureThreshold"] = 0
    doc["principals"][1]["limits"]["maxQueueWaitMs"] = -5
    assert problems(doc) == [
        ("workspace.concurrency", "must be at least 1, got 0"),
        ("providers.llm.circuitBreaker.failureThreshold", "must be at least 1, got 0"),
        ("principals[1].limits.maxQueueWaitMs", "must not be negative, got -5"),
    ]
    # The core itself stops at the first.
    with pytest.raises(InvalidProfileError, match=r"workspace\.concurrency"):
        Profile.from_dict(doc, workspace_id="acme")


def test_keys_ids_and_shapes_are_named_too():
    doc = copy.deepcopy(VALID)
    doc["extra"] = True
    del doc["providers"]
    doc["principals"][1]["id"] = "pat"
    doc["principals"][0]["limits"]["maxPrincipalShare"] = 0.5
    doc["workspace"]["maxQueueLength"] = 1.5
    found = problems(doc)
    assert found == [
        ("extra", "unknown key"),
        ("providers", "is required"),
        ("workspace.maxQueueLength", "must be an integer, got 1.5"),
        (
            "principals[0].limits.maxPrincipalShare",
            "is allowed only on workspace and provider limits",
        ),
        ("principals[1].id", "duplicate principal id 'pat'"),
    ]
    mapping = copy.deepcopy(VALID) | {"principals": {"": {"concurrency": 1}, "ok": {"c": 1}}}
    assert [field for field, _ in problems(mapping)] == [
        "principals.''",
        "principals.ok.c",
        "principals.ok.concurrency",
    ]
    assert problems([1]) == [("profile", "must be an object, got an array")]


def test_a_problem_between_parts_is_reported_once_the_parts_are_sound():
    doc = copy.deepcopy(VALID)
    doc["workspace"]["concurrency"] = 1
    doc["principals"][1]["limits"]["reservedConcurrency"] = 1
    ((field, problem),) = problems(doc)
    assert field == "principals" and "reservedConcurrency sums to 2" in problem


def test_the_error_carries_every_problem_and_reads_as_the_first():
    found = profile_problems({"profileVersion": 3}, workspace_id="acme")
    error = InvalidProfileDocument(found)
    assert isinstance(error, InvalidProfileError) and error.problems == found
    assert (error.field, error.problem) == (found[0].field, found[0].problem)
    assert len(found) == 4
