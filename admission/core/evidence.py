"""Records the core hands out: admission evidence, queue snapshots, profile and breaker history."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

PROFILE_CHANGE_SCHEMA = "decision-admission-profile-change/v1"


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One circuit-breaker state change of a provider lane; carries no workspace or principal id."""

    provider_id: str
    from_state: str
    to_state: str
    at_epoch_ms: float
    failures: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "providerId": self.provider_id,
            "from": self.from_state,
            "to": self.to_state,
            "atEpochMs": self.at_epoch_ms,
            "failures": self.failures,
        }


@dataclass(frozen=True, slots=True)
class ProfileChangeRecord:
    """A change of a workspace's current revision: `decision-admission-profile-change/v1`."""

    workspace_id: str
    kind: str
    previous_profile_version: str | None
    profile_version: str
    digest: str
    profile_digest: str
    at_epoch_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PROFILE_CHANGE_SCHEMA,
            "workspaceId": self.workspace_id,
            "kind": self.kind,
            "previousProfileVersion": self.previous_profile_version,
            "profileVersion": self.profile_version,
            "digest": self.digest,
            "profileDigest": self.profile_digest,
            "atEpochMs": self.at_epoch_ms,
        }


class QueueSnapshot(NamedTuple):
    """A principal's active permits and waiting requests in one controller."""

    active: int
    queued: int


@dataclass(slots=True)
class AdmissionEvidence:
    """Why one admission decision went the way it did; aggregate figures only, no identities."""

    decision: str
    reason: str
    queue_delay_ms: float
    active: int
    queued: int
    estimated_tokens: int | None
    estimated_cost_usd: float | None
    retry_pressure: int
    breaker_state: str
    retry_after_ms: float | None = None
    breaker_transitions: list[BreakerTransition] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "decision": self.decision,
            "reason": self.reason,
            "queueDelayMs": self.queue_delay_ms,
            "active": self.active,
            "queued": self.queued,
            "estimatedTokens": self.estimated_tokens,
            "estimatedCostUsd": self.estimated_cost_usd,
            "retryPressure": self.retry_pressure,
            "breakerState": self.breaker_state,
        }
        if self.retry_after_ms is not None:
            doc["retryAfterMs"] = self.retry_after_ms
        if self.breaker_transitions:
            doc["breakerTransitions"] = [t.to_dict() for t in self.breaker_transitions]
        return doc
