"""CNC-LOAD-002/003: fresh runs of both paths against the retained evidence."""

from __future__ import annotations

import copy
import json

import pytest

from evaluator.harness.errors import RecordDigestMismatchError
from evaluator.harness.records import (
    FLAG_OFFLINE_PASSED,
    FLAG_QUALIFIED,
    MODE_OFFLINE,
    evidence_flags,
    verify_record,
)
from evaluator.harness.service import run_manifest

from .conftest import EVIDENCE, MANIFESTS

TARGETS = ("admission-controller", "evaluator")
WINDOW_SECONDS = {"admission-controller": 990, "evaluator": 90}


@pytest.fixture(scope="module")
def fresh_records(manifest_v2):
    return {target: run_manifest(manifest_v2, target) for target in TARGETS}


@pytest.fixture(scope="module")
def retained_records():
    return {
        target: json.loads((EVIDENCE / f"{target}.json").read_text(encoding="utf-8"))
        for target in TARGETS
    }


@pytest.mark.parametrize("target", TARGETS)
def test_CNC_LOAD_002_every_bound_passes(fresh_records, manifest_v2, target):
    record = fresh_records[target]
    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    assert record["mode"] == MODE_OFFLINE
    assert record["target"] == target
    assert record["window"]["seconds"] == WINDOW_SECONDS[target]
    assert [c["bound"] for c in record["comparisons"]] == list(manifest_v2.bounds)
    failing = [c for c in record["comparisons"] if not c["pass"]]
    assert failing == []
    assert record["passed"] is True


@pytest.mark.parametrize("target", TARGETS)
def test_CNC_LOAD_002_every_arrival_is_accounted_for(fresh_records, target):
    observed = fresh_records[target]["observations"]
    assert observed["arrivals"] > 0
    assert (
        observed["shed"] + observed["completed"] + observed["failed"] + observed["cancelled"]
        == observed["arrivals"]
    )
    assert sum(observed["shedReasons"].values()) == observed["shed"]
    assert observed["attempts"] >= observed["arrivals"]
    assert observed["retryAmplificationRatio"] == observed["attempts"] / observed["arrivals"]


@pytest.mark.parametrize("target", TARGETS)
def test_CNC_LOAD_002_retained_record_verifies_and_is_reproduced(
    fresh_records, retained_records, target
):
    retained = retained_records[target]
    verify_record(retained, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    assert retained["passed"] is True
    assert retained["mode"] == MODE_OFFLINE
    fresh = fresh_records[target]
    # Everything observed on virtual time is deterministic; only host resources may differ.
    assert fresh["observations"] == retained["observations"]
    assert fresh["window"] == retained["window"]
    assert fresh["manifest"] == retained["manifest"]


def test_CNC_LOAD_003_retained_offline_evidence_never_promotes_g5(retained_records):
    records = list(retained_records.values())
    assert evidence_flags(records) == {FLAG_OFFLINE_PASSED: True, FLAG_QUALIFIED: False}


@pytest.mark.parametrize("target", TARGETS)
def test_CNC_LOAD_003_retained_record_with_one_altered_observation_fails(retained_records, target):
    tampered = copy.deepcopy(retained_records[target])
    tampered["observations"]["cancelled"] += 1
    with pytest.raises(RecordDigestMismatchError):
        verify_record(tampered)
    assert evidence_flags([tampered])[FLAG_OFFLINE_PASSED] is False
