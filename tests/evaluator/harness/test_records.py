from __future__ import annotations

import copy

import pytest

from evaluator.harness.errors import (
    RecordDigestMismatchError,
    RecordFormatError,
    RecordManifestMismatchError,
)
from evaluator.harness.records import (
    FLAG_OFFLINE_PASSED,
    FLAG_QUALIFIED,
    MODE_OFFLINE,
    MODE_STAGED,
    TARGET_STAGED,
    build_record,
    evidence_flags,
    verify_record,
)

from .conftest import MANIFESTS

HOST = {"python": "3.11.7", "platform": "test", "implementation": "CPython"}


def _observations(**overrides):
    observations = {
        "arrivals": 100,
        "attempts": 105,
        "completed": 90,
        "failed": 2,
        "shed": 6,
        "cancelled": 2,
        "shedReasons": {"queue-timeout": 6},
        "maximumActiveCalls": 4,
        "maximumQueuedCalls": 20,
        "maximumEligibleLaneWaitMs": 1200,
        "retryAmplificationRatio": 1.05,
        "maximumCancellationLatencyMs": 0,
        "quietPrincipalAdmissionRatio": 0.99,
        "noisyPrincipalAdmissionRatio": 0.9,
        "virtualDurationMs": 90_000,
    }
    observations.update(overrides)
    return observations


def _resources(**overrides):
    resources = {"heapPeakMiB": 12.5, "rssMiB": 80.0, "cpuSeconds": 0.2, "cpuPercentOneCore": 0.2}
    resources.update(overrides)
    return resources


def _record(manifest, mode=MODE_OFFLINE, target="admission-controller", **observed):
    return build_record(
        manifest=manifest,
        mode=mode,
        target=target,
        window={"startMs": 0, "endMs": 90_000, "seconds": 90},
        observations=_observations(**observed),
        resources=_resources(),
        host=HOST,
    )


def test_CNC_LOAD_003_a_built_record_verifies_against_its_manifest(manifest_v2):
    record = _record(manifest_v2)
    assert record["passed"] is True
    assert [c["bound"] for c in record["comparisons"]] == list(manifest_v2.bounds)
    assert verify_record(record) is record
    assert verify_record(record, manifest_v2.digest) is record
    assert verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes()) is record


def test_CNC_LOAD_003_one_altered_observation_fails_verification(manifest_v2):
    record = _record(manifest_v2)
    tampered = copy.deepcopy(record)
    tampered["observations"]["maximumActiveCalls"] = 3
    with pytest.raises(RecordDigestMismatchError, match="altered"):
        verify_record(tampered)
    assert evidence_flags([tampered]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: False}


def test_CNC_LOAD_003_a_recomputed_digest_cannot_hide_a_flipped_verdict(manifest_v2):
    from admission.core.canonical import sha256_digest

    record = _record(manifest_v2, maximumActiveCalls=9)
    assert record["passed"] is False
    forged = copy.deepcopy(record)
    forged["passed"] = True
    for comparison in forged["comparisons"]:
        comparison["pass"] = True
    del forged["digest"]
    forged["digest"] = sha256_digest(forged)
    with pytest.raises(RecordFormatError, match="wrong verdict"):
        verify_record(forged)


def test_CNC_LOAD_003_a_wrong_manifest_digest_fails_verification(manifest_v1, manifest_v2):
    record = _record(manifest_v2)
    with pytest.raises(RecordManifestMismatchError, match="not to"):
        verify_record(record, manifest_v1.digest)
    with pytest.raises(RecordManifestMismatchError):
        verify_record(record, (MANIFESTS / "load-manifest.v1.json").read_bytes())

    from admission.core.canonical import sha256_digest

    unknown = copy.deepcopy(record)
    unknown["manifest"]["digest"] = "sha256:" + "0" * 64
    del unknown["digest"]
    unknown["digest"] = sha256_digest(unknown)
    with pytest.raises(RecordManifestMismatchError, match="not preregistered"):
        verify_record(unknown)


def test_CNC_LOAD_003_offline_evidence_never_promotes_g5(manifest_v2):
    records = [_record(manifest_v2), _record(manifest_v2, target="evaluator")]
    assert evidence_flags(records) == {FLAG_OFFLINE_PASSED: True, FLAG_QUALIFIED: False}
    failing = _record(manifest_v2, maximumQueuedCalls=500)
    assert evidence_flags([*records, failing]) == {
        FLAG_OFFLINE_PASSED: False,
        FLAG_QUALIFIED: False,
    }


def test_CNC_LOAD_004_a_passing_staged_record_qualifies(manifest_v2):
    staged = _record(manifest_v2, mode=MODE_STAGED, target=TARGET_STAGED)
    offline = _record(manifest_v2)
    assert evidence_flags([offline, staged]) == {FLAG_OFFLINE_PASSED: True, FLAG_QUALIFIED: True}
    assert evidence_flags([staged]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: True}


def test_CNC_LOAD_004_a_failing_staged_record_disqualifies_the_set(manifest_v2):
    staged = _record(manifest_v2, mode=MODE_STAGED, target=TARGET_STAGED)
    failing = _record(
        manifest_v2, mode=MODE_STAGED, target=TARGET_STAGED, quietPrincipalAdmissionRatio=0.5
    )
    assert failing["passed"] is False
    flags = evidence_flags([_record(manifest_v2), staged, failing])
    assert flags == {FLAG_OFFLINE_PASSED: True, FLAG_QUALIFIED: False}


def test_CNC_LOAD_004_a_tampered_staged_record_disqualifies_the_set(manifest_v2):
    staged = _record(manifest_v2, mode=MODE_STAGED, target=TARGET_STAGED)
    tampered = copy.deepcopy(staged)
    tampered["resources"]["cpuPercentOneCore"] = 1.0
    assert evidence_flags([staged, tampered])[FLAG_QUALIFIED] is False


def test_missing_observation_fails_its_bound_closed(manifest_v2):
    record = _record(manifest_v2, quietPrincipalAdmissionRatio=None)
    quiet = next(
        c for c in record["comparisons"] if c["bound"] == "minimumQuietPrincipalAdmissionRatio"
    )
    assert quiet == {
        "bound": "minimumQuietPrincipalAdmissionRatio",
        "limit": 0.95,
        "observed": None,
        "pass": False,
    }
    assert record["passed"] is False
    verify_record(record)
