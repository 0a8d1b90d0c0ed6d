"""The records the core hands out (evidence, change records, rejections) and what hosts pass in."""

import pickle

import pytest

from admission.core.errors import REASONS, RETRYABLE_REASONS, AdmissionRejected
from admission.core.evidence import (
    PROFILE_CHANGE_SCHEMA,
    AdmissionEvidence,
    BreakerTransition,
    ProfileChangeRecord,
    QueueSnapshot,
)
from admission.core.request import AdmissionRequest, Estimate


def evidence(**overrides):
    fields = {
        "decision": "rejected",
        "reason": "queue-full",
        "queue_delay_ms": 12.5,
        "active": 3,
        "queued": 7,
        "estimated_tokens": 900,
        "estimated_cost_usd": 0.02,
        "retry_pressure": 2,
        "breaker_state": "closed",
    }
    fields.update(overrides)
    return AdmissionEvidence(**fields)


def transition(**overrides):
    fields = {
        "provider_id": "llm",
        "from_state": "closed",
        "to_state": "open",
        "at_epoch_ms": 1_700_000_000_000.0,
        "failures": 5,
    }
    fields.update(overrides)
    return BreakerTransition(**fields)


# Evidence


def test_evidence_without_hint_or_transitions_writes_the_nine_base_keys():
    assert evidence().to_dict() == {
        "decision": "rejected",
        "reason": "queue-full",
        "queueDelayMs": 12.5,
        "active": 3,
        "queued": 7,
        "estimatedTokens": 900,
        "estimatedCostUsd": 0.02,
        "retryPressure": 2,
        "breakerState": "closed",
    }


def test_evidence_writes_unknown_estimates_as_null():
    doc = evidence(estimated_tokens=None, estimated_cost_usd=None).to_dict()
    assert doc["estimatedTokens"] is None
    assert doc["estimatedCostUsd"] is None


def test_evidence_writes_the_retry_hint_and_transitions_when_present():
    opened = transition()
    probing = transition(from_state="open", to_state="half-open", at_epoch_ms=5.0, failures=0)
    doc = evidence(retry_after_ms=250.0, breaker_transitions=[opened, probing]).to_dict()
    assert doc == {
        "decision": "rejected",
        "reason": "queue-full",
        "queueDelayMs": 12.5,
        "active": 3,
        "queued": 7,
        "estimatedTokens": 900,
        "estimatedCostUsd": 0.02,
        "retryPressure": 2,
        "breakerState": "closed",
        "retryAfterMs": 250.0,
        "breakerTransitions": [
            {
                "providerId": "llm",
                "from": "closed",
                "to": "open",
                "atEpochMs": 1_700_000_000_000.0,
                "failures": 5,
            },
            {
                "providerId": "llm",
                "from": "open",
                "to": "half-open",
                "atEpochMs": 5.0,
                "failures": 0,
            },
        ],
    }


def test_a_zero_retry_hint_is_still_written():
    assert evidence(retry_after_ms=0.0).to_dict()["retryAfterMs"] == 0.0


def test_evidence_instances_do_not_share_their_transition_lists():
    first, second = evidence(), evidence()
    first.breaker_transitions.append(transition())
    assert second.breaker_transitions == []
    assert "breakerTransitions" not in second.to_dict()


def test_a_breaker_transition_is_immutable_and_carries_no_identity():
    record = transition()
    with pytest.raises(AttributeError):
        record.failures = 6
    assert set(record.to_dict()) == {"providerId", "from", "to", "atEpochMs", "failures"}


# Profile change records


def test_a_profile_change_record_writes_its_schema_and_every_field():
    record = ProfileChangeRecord(
        workspace_id="ws-1",
        kind="activated",
        previous_profile_version="v1",
        profile_version="v2",
        digest="sha256:aa",
        profile_digest="sha256:bb",
        at_epoch_ms=1234.5,
    )
    assert record.to_dict() == {
        "schema": "decision-admission-profile-change/v1",
        "workspaceId": "ws-1",
        "kind": "activated",
        "previousProfileVersion": "v1",
        "profileVersion": "v2",
        "digest": "sha256:aa",
        "profileDigest": "sha256:bb",
        "atEpochMs": 1234.5,
    }
    assert PROFILE_CHANGE_SCHEMA == "decision-admission-profile-change/v1"


def test_a_first_profile_change_writes_a_null_previous_version():
    record = ProfileChangeRecord("ws-1", "registered", None, "v1", "sha256:a", "sha256:b", 0.0)
    assert record.to_dict()["previousProfileVersion"] is None


def test_queue_snapshot_is_a_pair_of_active_and_queued():
    snapshot = QueueSnapshot(active=2, queued=5)
    assert tuple(snapshot) == (2, 5)
    assert (snapshot.active, snapshot.queued) == (2, 5)


# Rejections


def test_a_rejection_names_its_reason_and_the_retry_hint():
    plain = AdmissionRejected("circuit-open", evidence(reason="circuit-open"))
    assert str(plain) == "admission rejected: circuit-open"
    hinted = AdmissionRejected("queue-full", evidence(), retry_after_ms=1500.0)
    assert str(hinted) == "admission rejected: queue-full (retry after 1500 ms)"
    assert str(AdmissionRejected("queue-timeout", evidence(), 2.5)) == (
        "admission rejected: queue-timeout (retry after 2.5 ms)"
    )
    assert str(AdmissionRejected("queue-full", evidence(), 0.0)) == (
        "admission rejected: queue-full (retry after 0 ms)"
    )


@pytest.mark.parametrize("reason", sorted(REASONS))
def test_exactly_the_queue_and_coordination_reasons_are_retryable(reason):
    rejection = AdmissionRejected(reason, evidence(reason=reason))
    expected = reason in {"queue-full", "queue-timeout", "coordination-unavailable"}
    assert rejection.retryable is expected
    assert (reason in RETRYABLE_REASONS) is expected


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match=r"^unknown admission reason 'too-busy'$"):
        AdmissionRejected("too-busy", evidence())


def test_a_rejection_can_be_rebuilt_from_its_args():
    proof = evidence(retry_after_ms=40.0)
    rejection = AdmissionRejected("queue-full", proof, retry_after_ms=40.0)
    assert rejection.args == ("queue-full", proof, 40.0)
    rebuilt = AdmissionRejected(*rejection.args)
    assert (rebuilt.reason, rebuilt.evidence, rebuilt.retry_after_ms, rebuilt.retryable) == (
        "queue-full",
        proof,
        40.0,
        True,
    )


def test_a_pickled_rejection_keeps_reason_evidence_and_hint():
    proof = evidence(breaker_transitions=[transition()])
    rejection = AdmissionRejected("queue-timeout", proof, retry_after_ms=300.0)
    again = pickle.loads(pickle.dumps(rejection))
    assert again.args == ("queue-timeout", proof, 300.0)
    assert (again.reason, again.retry_after_ms, again.retryable) == ("queue-timeout", 300.0, True)
    assert again.evidence.to_dict() == proof.to_dict()
    assert str(again) == "admission rejected: queue-timeout (retry after 300 ms)"


# Requests and estimates


def test_an_estimate_repr_shows_every_field():
    estimate = Estimate(tokens=900, cost_usd=0.5, items=3)
    assert repr(estimate) == (
        "Estimate(attempts=None, batch_size=None, cost_usd=0.5, items=3, request_bytes=None, "
        "retained_work=None, tokens=900)"
    )
    odd = Estimate(tokens="lots", request_bytes=-1, attempts=2.0, batch_size=True)
    assert repr(odd) == (
        "Estimate(attempts=2.0, batch_size=True, cost_usd=None, items=None, request_bytes=-1, "
        "retained_work=None, tokens='lots')"
    )


def test_a_request_without_an_estimate_gets_an_unknown_one():
    request = AdmissionRequest("inv-1", "alice", "ws-1", "llm")
    assert isinstance(request.estimate, Estimate)
    assert repr(request.estimate) == repr(Estimate())
    assert (request.deadline_ms, request.signal) == (None, None)
    other = AdmissionRequest("inv-2", "alice", "ws-1", "llm")
    assert other.estimate is not request.estimate


def test_a_request_keeps_the_estimate_it_was_given():
    estimate = Estimate(tokens=10)
    request = AdmissionRequest("inv-1", "alice", "ws-1", "llm", estimate=estimate)
    assert request.estimate is estimate


def test_a_request_repr_leaves_out_principal_and_workspace_ids():
    request = AdmissionRequest(
        budget_id="inv-7",
        principal_id="principal-secret",
        workspace_id="workspace-secret",
        provider_id="llm",
        estimate=Estimate(tokens=5),
        deadline_ms=1500.0,
    )
    text = repr(request)
    assert text == "AdmissionRequest(budget_id='inv-7', provider_id='llm', deadline_ms=1500.0)"
    assert "principal-secret" not in text
    assert "workspace-secret" not in text
