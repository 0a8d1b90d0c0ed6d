"""What an evaluation produced: attempts, per-decision outcomes and the result, in ruleset order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ATTEMPT_OUTCOMES",
    "AttemptRecord",
    "DecisionOutcome",
    "EvaluationResult",
    "outcome_for_rejection",
]

SUCCEEDED = "succeeded"
RATE_LIMITED = "rate-limited"
BUDGET_EXHAUSTED = "budget-exhausted"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
OVERLOADED = "overloaded"
EXECUTION_UNCERTAIN = "execution-uncertain"
PROVIDER_ERROR = "provider-error"
INVALID_OUTPUT = "invalid-output"
ESTIMATE_FAILED = "estimate-failed"

ATTEMPT_OUTCOMES = frozenset(
    {
        SUCCEEDED,
        RATE_LIMITED,
        BUDGET_EXHAUSTED,
        TIMEOUT,
        CANCELLED,
        OVERLOADED,
        EXECUTION_UNCERTAIN,
        PROVIDER_ERROR,
        INVALID_OUTPUT,
        ESTIMATE_FAILED,
    }
)

_REJECTION_OUTCOMES = {
    "requests-per-minute": RATE_LIMITED,
    "tokens-per-second": RATE_LIMITED,
    "retry-after": RATE_LIMITED,
    "attempts": BUDGET_EXHAUSTED,
    "cost": BUDGET_EXHAUSTED,
    "unknown-cost": BUDGET_EXHAUSTED,
    "tokens": BUDGET_EXHAUSTED,
    "unknown-tokens": BUDGET_EXHAUSTED,
    "deadline-exceeded": TIMEOUT,
    "queue-timeout": TIMEOUT,
}


def outcome_for_rejection(reason: str, *, deadline_fired: bool) -> str:
    """The attempt outcome of an admission rejection (see docs/evaluator.md).

    ``cancelled`` becomes ``timeout`` when a deadline, not the caller, fired the signal; every
    reason without its own mapping (``queue-full``, ``unconfigured-provider``, ...) is
    ``overloaded``.
    """
    if reason == "cancelled":
        return TIMEOUT if deadline_fired else CANCELLED
    return _REJECTION_OUTCOMES.get(reason, OVERLOADED)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One try of one target. ``sent`` is false for anything refused before dispatch.

    ``reason`` is the admission reason for a rejection, or a fixed-vocabulary detail of the
    adapter outcome (``http-429``, ``connect-error``, ``dispatch-unconfirmed``...). ``evidence``
    is the admission evidence (camelCase JSON) when admission decided.
    """

    target_index: int
    adapter_id: str
    model: str
    number: int
    sent: bool
    outcome: str
    reason: str
    retryable: bool = False
    evidence: Mapping[str, Any] | None = None
    retry_after_ms: float | None = None
    tokens: int | None = None
    started_ms: float = 0.0
    ended_ms: float = 0.0
    # What the call cost as reconciled with admission (the provider's figure, or tokens times
    # the target's price), when known.
    cost_usd: float | None = None
    # An aborted call that may have reached the provider keeps its permit: why, and until when
    # (``{"reason", "untilMs"}``, on the run's millisecond scale).
    permit_held: Mapping[str, Any] | None = None
    # Refusals caused by our own infrastructure (``coordination-unavailable``) that this
    # attempt waited through instead of failing: count by reason, and the time spent waiting.
    infrastructure_refusals: Mapping[str, int] | None = None
    infrastructure_wait_ms: float | None = None
    # The reasons admission deferred this attempt for before its decision, first seen first.
    deferred_by: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "targetIndex": self.target_index,
            "adapterId": self.adapter_id,
            "model": self.model,
            "number": self.number,
            "sent": self.sent,
            "outcome": self.outcome,
            "reason": self.reason,
            "retryable": self.retryable,
            "startedMs": self.started_ms,
            "endedMs": self.ended_ms,
        }
        if self.evidence is not None:
            doc["evidence"] = dict(self.evidence)
        if self.retry_after_ms is not None:
            doc["retryAfterMs"] = self.retry_after_ms
        if self.tokens is not None:
            doc["tokens"] = self.tokens
        if self.cost_usd is not None:
            doc["costUsd"] = self.cost_usd
        if self.permit_held is not None:
            doc["permitHeld"] = dict(self.permit_held)
        if self.infrastructure_refusals:
            doc["infrastructureRefusals"] = dict(self.infrastructure_refusals)
            doc["infrastructureWaitMs"] = self.infrastructure_wait_ms or 0.0
        if self.deferred_by:
            doc["deferredBy"] = list(self.deferred_by)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AttemptRecord:
        """Rebuild a record written by ``to_dict`` (receipts)."""
        return cls(
            target_index=doc["targetIndex"],
            adapter_id=doc["adapterId"],
            model=doc["model"],
            number=doc["number"],
            sent=doc["sent"],
            outcome=doc["outcome"],
            reason=doc["reason"],
            retryable=doc.get("retryable", False),
            evidence=doc.get("evidence"),
            retry_after_ms=doc.get("retryAfterMs"),
            tokens=doc.get("tokens"),
            started_ms=doc.get("startedMs", 0.0),
            ended_ms=doc.get("endedMs", 0.0),
            cost_usd=doc.get("costUsd"),
            permit_held=doc.get("permitHeld"),
            infrastructure_refusals=doc.get("infrastructureRefusals"),
            infrastructure_wait_ms=doc.get("infrastructureWaitMs"),
            deferred_by=tuple(doc["deferredBy"]) if doc.get("deferredBy") else None,
        )


@dataclass(frozen=True, slots=True)
class DecisionOutcome:
    """The end of one decision: ``status`` is ``succeeded`` or the outcome that ended it."""

    decision_id: str
    status: str
    output: Any = None
    attempts: tuple[AttemptRecord, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCEEDED

    def to_dict(self) -> dict[str, Any]:
        return {
            "decisionId": self.decision_id,
            "status": self.status,
            "output": self.output,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DecisionOutcome:
        return cls(
            decision_id=doc["decisionId"],
            status=doc["status"],
            output=doc.get("output"),
            attempts=tuple(AttemptRecord.from_dict(item) for item in doc.get("attempts", ())),
        )


@dataclass(frozen=True, slots=True)
class EvaluationResult:
    """Every decision's outcome, always in the ruleset's canonical order.

    ``status`` is ``completed`` when every decision reached an outcome on its own, ``cancelled``
    when the caller cancelled and ``timeout`` when the total deadline ended the run.
    ``concurrency`` is the ceiling the run was scheduled under and ``max_active`` the most
    decisions that ever held a scheduler permit at once.
    """

    invocation_id: str
    ruleset_id: str
    status: str
    decisions: tuple[DecisionOutcome, ...]
    concurrency: int = 1
    max_active: int = 0
    resumed: bool = False

    @property
    def succeeded(self) -> bool:
        return self.status == "completed" and all(d.succeeded for d in self.decisions)

    @property
    def outputs(self) -> dict[str, Any]:
        """Decision id → output, in canonical order."""
        return {d.decision_id: d.output for d in self.decisions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "invocationId": self.invocation_id,
            "rulesetId": self.ruleset_id,
            "status": self.status,
            "concurrency": self.concurrency,
            "maxActive": self.max_active,
            "resumed": self.resumed,
            "decisions": [d.to_dict() for d in self.decisions],
        }
