"""CNC-LOAD-WHATIF: the v2 manifest's arrivals and bounds against a proposed profile's limits."""

from __future__ import annotations

import copy

import pytest

from evaluator.harness.errors import LoadHarnessError, RecordDigestMismatchError
from evaluator.harness.records import (
    FLAG_OFFLINE_PASSED,
    FLAG_QUALIFIED,
    MODE_WHAT_IF,
    build_record,
    evidence_flags,
    verify_record,
)
from evaluator.harness.service import run_manifest
from evaluator.harness.what_if import WhatIfError, map_ids, run_what_if

from .conftest import MANIFESTS

PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")


def _profile(manifest, label, **changes):
    document = copy.deepcopy({key: manifest.document[key] for key in PROFILE_KEYS})
    document["profileVersion"] = label
    for entry in document["principals"]:
        entry["limits"].update(changes.get(entry["class"], {}))
    document["workspace"].update(changes.get("workspace", {}))
    return document


def _failing(record):
    return {c["bound"] for c in record["comparisons"] if not c["pass"]}


def test_CNC_LOAD_WHATIF_the_manifests_own_limits_reproduce_the_offline_run(manifest_v2):
    record = run_what_if(manifest_v2, _profile(manifest_v2, "same"), "admission-controller")
    offline = run_manifest(manifest_v2, "admission-controller")
    # Same arrivals, same limits, same ids: the deterministic observations are the offline ones.
    assert record["observations"] == offline["observations"]
    assert record["mode"] == MODE_WHAT_IF
    assert record["passed"] is True
    assert record["whatIf"]["profileVersion"] == "same"
    assert record["whatIf"]["mapping"]["principals"] == {
        "noisy": "noisy",
        "quiet-reserved": "quiet-reserved",
        "quiet-a": "quiet-a",
        "quiet-b": "quiet-b",
        "quiet-c": "quiet-c",
    }
    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())


@pytest.mark.parametrize("target", ["admission-controller", "evaluator"])
def test_CNC_LOAD_WHATIF_a_tighter_and_a_looser_version_get_different_correct_verdicts(
    manifest_v2, target
):
    # Tighter: each quiet principal may send 30 requests a minute, a fraction of its arrivals.
    tighter = _profile(manifest_v2, "tighter", quiet={"requestsPerMinute": 30})
    # Looser: twice the request rate and queue room for everyone, concurrency unchanged.
    looser = _profile(
        manifest_v2,
        "looser",
        quiet={"requestsPerMinute": 1200, "maxQueueLength": 64},
        noisy={"requestsPerMinute": 12000, "maxQueueLength": 256},
    )
    tight = run_what_if(manifest_v2, tighter, target)
    loose = run_what_if(manifest_v2, looser, target)

    assert loose["passed"] is True
    assert _failing(loose) == set()
    assert tight["passed"] is False
    assert "minimumQuietPrincipalAdmissionRatio" in _failing(tight)
    quiet = tight["observations"]["quietPrincipalAdmissionRatio"]
    assert quiet < 0.95 <= loose["observations"]["quietPrincipalAdmissionRatio"]
    # The quiet principals were shed by their request rate, waiting out their queue bound.
    assert tight["observations"]["shedReasons"].get("queue-timeout", 0) > loose["observations"][
        "shedReasons"
    ].get("queue-timeout", 0)
    # Same manifest, same timeline: only the limits differ.
    assert tight["observations"]["arrivals"] == loose["observations"]["arrivals"]
    assert tight["manifest"] == loose["manifest"] == manifest_v2.identity()
    for record in (tight, loose):
        verify_record(record, manifest_v2)


def test_CNC_LOAD_WHATIF_more_concurrency_breaks_the_active_call_bound(manifest_v2):
    wider = _profile(manifest_v2, "wider", workspace={"concurrency": 8})
    for provider in wider["providers"].values():
        provider["concurrency"] = 6
    record = run_what_if(manifest_v2, wider, "admission-controller")
    assert _failing(record) == {"maximumActiveCalls"}
    assert record["observations"]["maximumActiveCalls"] == 8


def test_CNC_LOAD_WHATIF_records_never_set_or_spoil_a_flag(manifest_v2):
    passing = run_what_if(manifest_v2, _profile(manifest_v2, "same"), "evaluator")
    failing = run_what_if(
        manifest_v2, _profile(manifest_v2, "tight", quiet={"requestsPerMinute": 30}), "evaluator"
    )
    offline = run_manifest(manifest_v2, "evaluator")
    assert evidence_flags([passing]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: False}
    assert evidence_flags([offline, failing]) == {FLAG_OFFLINE_PASSED: True, FLAG_QUALIFIED: False}

    tampered = copy.deepcopy(passing)
    tampered["whatIf"]["profileVersion"] = "another"
    with pytest.raises(RecordDigestMismatchError):
        verify_record(tampered)


def test_CNC_LOAD_WHATIF_only_what_if_records_name_a_profile(manifest_v2):
    offline = run_manifest(manifest_v2, "evaluator")
    arguments = {
        "manifest": manifest_v2,
        "target": "evaluator",
        "window": offline["window"],
        "observations": offline["observations"],
        "resources": offline["resources"],
    }
    with pytest.raises(LoadHarnessError, match="name the profile"):
        build_record(mode=MODE_WHAT_IF, **arguments)
    with pytest.raises(LoadHarnessError, match="name the profile"):
        build_record(mode="offline-fake-provider", what_if={"profileVersion": "x"}, **arguments)


def test_default_mapping_is_by_id_then_by_position_wrapping_around(manifest_v2):
    from admission.core import Profile

    profile = Profile.from_dict(
        {
            "profileVersion": "small",
            "workspace": {"concurrency": 4},
            "providers": {"openai": {"concurrency": 4}, "jev": {"concurrency": 2}},
            "principals": {
                "quiet-a": {"concurrency": 1},
                "bob": {"concurrency": 2},
                "ann": {"concurrency": 2},
            },
        },
        workspace_id="w",
    )
    mapping = map_ids(manifest_v2, profile)
    # Manifest order noisy, quiet-reserved, quiet-a, quiet-b, quiet-c onto sorted ann, bob, quiet-a.
    assert mapping.principals == {
        "noisy": "ann",
        "quiet-reserved": "bob",
        "quiet-a": "quiet-a",
        "quiet-b": "ann",
        "quiet-c": "bob",
    }
    assert mapping.providers == {"jev": "jev", "llm-subagent": "openai"}

    explicit = map_ids(
        manifest_v2, profile, {"principals": {"noisy": "bob"}, "providers": {"jev": "openai"}}
    )
    assert explicit.principals["noisy"] == "bob"
    assert explicit.providers == {"jev": "openai", "llm-subagent": "openai"}


@pytest.mark.parametrize(
    ("mapping", "field"),
    [
        ({"principals": {"nobody": "ann"}}, "mapping.principals.nobody"),
        ({"principals": {"noisy": "carol"}}, "mapping.principals.noisy"),
        ({"providers": {"jev": 3}}, "mapping.providers"),
        ({"callers": {}}, "mapping.callers"),
        (["noisy"], "mapping"),
    ],
)
def test_a_bad_mapping_is_a_typed_error_naming_the_field(manifest_v2, mapping, field):
    document = _profile(manifest_v2, "same")
    document["principals"] = {"ann": {"concurrency": 2}}
    with pytest.raises(WhatIfError) as raised:
        run_what_if(manifest_v2, document, "evaluator", mapping=mapping)
    assert raised.value.field == field


def test_an_invalid_profile_is_refused_before_running(manifest_v2):
    document = _profile(manifest_v2, "bad", workspace={"concurrency": 0})
    with pytest.raises(WhatIfError, match=r"workspace\.concurrency") as raised:
        run_what_if(manifest_v2, document, "evaluator")
    assert raised.value.field == "profile"
