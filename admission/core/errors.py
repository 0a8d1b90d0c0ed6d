"""Exceptions of the admission core and the vocabulary of admission reasons."""

from __future__ import annotations

from typing import Any

__all__ = [
    "REASONS",
    "RETRYABLE_REASONS",
    "AdmissionRejected",
    "InvalidProfileError",
    "ProfileConflictError",
]

REASONS: frozenset[str] = frozenset(
    {
        "admitted",
        "cancelled",
        "deadline-exceeded",
        "concurrency",
        "requests-per-minute",
        "tokens-per-second",
        "attempts",
        "batch-size",
        "cost",
        "unknown-cost",
        "tokens",
        "unknown-tokens",
        "queue-full",
        "queue-timeout",
        "invalid-estimate",
        "request-too-large",
        "too-many-items",
        "retained-work",
        "unknown-retained-work",
        "retry-after",
        "circuit-open",
        "unconfigured-provider",
        "unconfigured-principal",
        # Deployment-wide admission could not reach its shared state; nothing was consumed.
        "coordination-unavailable",
    }
)

RETRYABLE_REASONS: frozenset[str] = frozenset(
    {"queue-full", "queue-timeout", "coordination-unavailable"}
)


class InvalidProfileError(ValueError):
    """A profile document (or a part of it) breaks the rules of docs/admission-core.md.

    ``field`` is the dotted path of the offending field, for example
    ``providers.jev.circuitBreaker.failureThreshold`` or ``principals[2].limits.concurrency``.
    """

    def __init__(self, field: str, problem: str) -> None:
        # Both parts stay in args so the exception survives pickling between processes.
        super().__init__(field, problem)
        self.field = field
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


class ProfileConflictError(Exception):
    """A ``profileVersion`` was registered again with a different ``profileDigest``."""

    def __init__(
        self,
        workspace_id: str,
        profile_version: str,
        existing_digest: str,
        new_digest: str,
    ) -> None:
        super().__init__(workspace_id, profile_version, existing_digest, new_digest)
        self.workspace_id = workspace_id
        self.profile_version = profile_version
        self.existing_digest = existing_digest
        self.new_digest = new_digest

    def __str__(self) -> str:
        return (
            f"profileVersion {self.profile_version!r} of workspace {self.workspace_id!r} is "
            f"already registered with {self.existing_digest}; refusing {self.new_digest}"
        )


class AdmissionRejected(Exception):
    """An adapter attempt was refused before it was sent.

    ``reason`` is one of ``REASONS``; ``retryable`` is true exactly for ``queue-full``,
    ``queue-timeout`` and ``coordination-unavailable``; ``retry_after_ms`` is an optional hint;
    ``evidence`` is the ``AdmissionEvidence`` of the decision.
    """

    def __init__(self, reason: str, evidence: Any, retry_after_ms: float | None = None) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown admission reason {reason!r}")
        super().__init__(reason, evidence, retry_after_ms)
        self.reason = reason
        self.retryable = reason in RETRYABLE_REASONS
        self.retry_after_ms = retry_after_ms
        self.evidence = evidence

    def __str__(self) -> str:
        text = f"admission rejected: {self.reason}"
        if self.retry_after_ms is not None:
            text += f" (retry after {self.retry_after_ms:g} ms)"
        return text
