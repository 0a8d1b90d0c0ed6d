"""Exceptions of the admission core and the vocabulary of admission reasons."""

from __future__ import annotations

from typing import Any

__all__ = [
    "REASONS",
    "RETRYABLE_REASONS",
    "AdmissionRejected",
    "InvalidFieldError",
    "InvalidProfileError",
    "ProfileConflictError",
    "ServiceError",
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


class ServiceError(Exception):
    """A refusal every interface reports the same way: the admission and evaluator services
    raise its subclasses, and the API, the admin and the shell each translate it in one place.

    `code` says what kind of refusal it is (`invalid`: the input; `conflict`: the state does not
    allow it now; `four_eyes`, `permission_denied`: who asks; and the evaluator's own), `message`
    what is wrong, and `field` the input at fault when there is one. `document` names the input
    that holds a whole document when `field` is a dotted path inside it.
    """

    code = "invalid"
    field: str | None = None
    document: str | None = None

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field
        if code is not None:
            self.code = code

    def reasons(self) -> list[str]:
        """Each problem on its own line, for the input at fault (one unless overridden)."""
        return [str(self)]

    def summary(self) -> str:
        """The refusal in one line that names its field (for a message or a command line)."""
        text = str(self)
        if self.field and not text.startswith(f"{self.field}:"):
            return f"{self.field}: {text}"
        return text


class InvalidFieldError(ServiceError, ValueError):
    """A document breaks a rule at one field: ``field`` is its dotted path, ``problem`` what is
    wrong; its text is ``field: problem``."""

    field: str

    def __init__(self, field: str, problem: str) -> None:
        # Both parts stay in args so the exception survives pickling between processes.
        Exception.__init__(self, field, problem)
        self.message = problem
        self.field = field
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


class InvalidProfileError(InvalidFieldError):
    """A profile document (or a part of it) breaks the rules of docs/admission-core.md.

    ``field`` is the dotted path of the offending field, for example
    ``providers.jev.circuitBreaker.failureThreshold`` or ``principals[2].limits.concurrency``;
    every interface takes the profile as its ``document``.
    """

    document = "document"


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
