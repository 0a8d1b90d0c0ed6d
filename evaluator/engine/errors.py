"""Typed errors of the decision evaluator."""

from __future__ import annotations

from admission.core.errors import InvalidFieldError

__all__ = ["InvalidDefinitionError", "ReceiptConflictError"]


class InvalidDefinitionError(InvalidFieldError):
    """A ruleset, request or referenced profile is malformed; nothing was dispatched.

    ``reason`` is always ``"invalid-definition"``; ``field`` is the dotted path of the offending
    field (``ruleset.decisions[2].binding.primary.timeoutMs``) and ``problem`` says what is wrong.
    """

    reason = "invalid-definition"


class ReceiptConflictError(RuntimeError):
    """Another writer changed the receipt since it was read (optimistic concurrency lost)."""

    def __init__(self, invocation_id: str, expected_revision: int) -> None:
        super().__init__(invocation_id, expected_revision)
        self.invocation_id = invocation_id
        self.expected_revision = expected_revision

    def __str__(self) -> str:
        return (
            f"receipt {self.invocation_id!r} is no longer at revision {self.expected_revision}; "
            "another worker is running this invocation"
        )
