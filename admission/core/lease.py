"""What both controllers' leases share: the one check of a release's reported outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from admission.core.rules import valid_amount, valid_count

__all__ = ["NO_OUTCOME", "ReleaseOutcome", "give_back_checked"]


@dataclass(frozen=True, slots=True)
class ReleaseOutcome:
    """What the host reports when it gives a permit back; every figure is optional.

    `success=None` is "no outcome" and never a provider failure.
    """

    success: bool | None = None
    retry_after_ms: float | None = None
    actual_tokens: int | None = None
    actual_cost_usd: float | None = None

    @classmethod
    def checked(
        cls,
        success: object = None,
        retry_after_ms: object = None,
        actual_tokens: object = None,
        actual_cost_usd: object = None,
    ) -> tuple[ReleaseOutcome, list[str]]:
        """The outcome with malformed figures dropped, and what was wrong with them."""
        problems = []
        if success is not None and type(success) is not bool:
            problems.append("success must be True, False or None")
            success = None
        if retry_after_ms is not None and not valid_amount(retry_after_ms):
            problems.append("retry_after_ms must be a finite non-negative number")
            retry_after_ms = None
        if actual_tokens is not None and not valid_count(actual_tokens):
            problems.append("actual_tokens must be a non-negative integer")
            actual_tokens = None
        if actual_cost_usd is not None and not valid_amount(actual_cost_usd):
            problems.append("actual_cost_usd must be a finite non-negative number")
            actual_cost_usd = None
        outcome = cls(
            success,  # type: ignore[arg-type]
            None if retry_after_ms is None else float(retry_after_ms),  # type: ignore[arg-type]
            None if actual_tokens is None else int(actual_tokens),  # type: ignore[call-overload]
            None if actual_cost_usd is None else float(actual_cost_usd),  # type: ignore[arg-type]
        )
        return outcome, problems


NO_OUTCOME = ReleaseOutcome()


def give_back_checked(
    give_back: Callable[[ReleaseOutcome], None],
    success: object = None,
    retry_after_ms: object = None,
    actual_tokens: object = None,
    actual_cost_usd: object = None,
) -> None:
    """What every lease's `release` does once: give the permit back with the reported outcome.

    Malformed optional figures are dropped before the permit goes back, and then reported with
    `ValueError` (a host bug must not leak capacity).
    """
    nothing = success is None and retry_after_ms is None and actual_tokens is None
    if nothing and actual_cost_usd is None:
        give_back(NO_OUTCOME)
        return
    outcome, problems = ReleaseOutcome.checked(
        success, retry_after_ms, actual_tokens, actual_cost_usd
    )
    give_back(outcome)
    if problems:
        raise ValueError("; ".join(problems))
