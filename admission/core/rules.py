"""The static admission rules, written once: estimate figures, per-scope bounds and budgets.

A request is judged against the three scopes of its lane (principal, workspace, provider). The
static rules depend only on the request's estimate and the scopes' limits, never on what is in
flight, so they are kept here as one table of *terms* per scope. Two readers use that table:

- `static_reason` walks it in the documented order and names the first failure;
- `compile_gate` folds it into the tightest bound per estimate figure, so the controller's hot
  path asks `gate_fails` one cheap question and only walks the table when something can fail.

Invocation budgets (`budget_reason`) depend on what a budget id has already used and are judged
per scope after the static rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from admission.core.limits import Limits

__all__ = [
    "EPSILON",
    "Figures",
    "Gate",
    "budget_reason",
    "compile_gate",
    "count_or_none",
    "gate_fails",
    "has_budgets",
    "static_reason",
    "valid_amount",
    "valid_count",
]

# Comparisons of refilled bucket levels and summed costs allow for float rounding.
EPSILON = 1e-9


class Figures(Protocol):
    """A judged estimate: valid non-negative figures, `None` where the host did not know."""

    tokens: int | None
    cost: float | None
    request_bytes: int | None
    items: int | None
    batch_size: int | None
    retained_work: int | None
    attempts: int
    # Every dispatch takes exactly one request from a request bucket.
    requests: int


# (figure, ceiling or None, figure required, reason when above the ceiling, reason when unknown)
Term = tuple[str, float | None, bool, str, str]
# ((figure, tightest ceiling or None, figure required), ...)
Gate = tuple[tuple[str, float | None, bool], ...]


def valid_count(value: Any) -> bool:
    """A non-negative integer; an integral float counts, a bool never does."""
    if type(value) is int:
        return value >= 0
    if type(value) is float:
        return math.isfinite(value) and value >= 0 and value.is_integer()
    return False


def valid_amount(value: Any) -> bool:
    """A finite non-negative number (money, milliseconds, rates); a bool never is one."""
    kind = type(value)
    if kind is int:
        return value >= 0
    if kind is float:
        return math.isfinite(value) and value >= 0
    return False


def count_or_none(value: Any) -> int | None:
    """The value as an int when it is a valid count, else None (for figures reported by others)."""
    return int(value) if valid_count(value) else None


def _static_terms(limits: Limits) -> tuple[Term, ...]:
    """The bounds one scope places on any estimate, in the order they are judged."""
    retained = limits.max_retained_work
    return (
        ("batch_size", limits.max_batch_size, False, "batch-size", ""),
        ("request_bytes", limits.max_request_bytes, False, "request-too-large", ""),
        ("items", limits.max_items, False, "too-many-items", ""),
        ("retained_work", retained, retained is not None, "retained-work", "unknown-retained-work"),
        # A cost ceiling fails closed on an unknown cost unless the scope allows it.
        (
            "cost",
            None,
            limits.max_cost_usd is not None and not limits.allow_unknown_cost,
            "",
            "unknown-cost",
        ),
        ("tokens", None, limits.max_tokens is not None, "", "unknown-tokens"),
    )


def _never_fit_terms(limits: Limits) -> tuple[Term, ...]:
    """Requests a scope's buckets can never hold: waiting for a refill would be waiting forever."""
    rpm = limits.requests_per_minute
    return (
        # Only a rate of zero refuses everything; a positive rate refills to one request.
        ("requests", 0 if rpm is not None and rpm <= 0 else None, False, "requests-per-minute", ""),
        # An unknown token estimate counts as zero against the token bucket.
        ("tokens", limits.tokens_per_second, False, "tokens-per-second", ""),
    )


def _first_failure(figures: Figures, terms: Iterable[Term]) -> str | None:
    for figure, ceiling, required, over, unknown in terms:
        value = getattr(figures, figure)
        if value is None:
            if required:
                return unknown
        elif ceiling is not None and value > ceiling:
            return over
    return None


def static_reason(figures: Figures, scopes: Iterable[Limits]) -> str | None:
    """Why the request can never be admitted under these limits (principal, workspace, provider).

    Static bounds first, scope by scope (the first scope with a failure decides), then requests
    no bucket can ever hold. None when every static rule passes.
    """
    scopes = tuple(scopes)
    for limits in scopes:
        reason = _first_failure(figures, _static_terms(limits))
        if reason is not None:
            return reason
    for limits in scopes:
        reason = _first_failure(figures, _never_fit_terms(limits))
        if reason is not None:
            return reason
    return None


def compile_gate(scopes: Iterable[Limits]) -> Gate:
    """The static rules of a lane's scopes folded into the tightest bound per figure."""
    ceilings: dict[str, float | None] = {}
    required: dict[str, bool] = {}
    for limits in scopes:
        for figure, ceiling, needed, _over, _unknown in (
            *_static_terms(limits),
            *_never_fit_terms(limits),
        ):
            if ceiling is None and not needed:
                continue
            known = ceilings.get(figure)
            if ceiling is not None and (known is None or ceiling < known):
                known = ceiling
            ceilings[figure] = known
            required[figure] = required.get(figure, False) or needed
    return tuple((figure, ceilings[figure], required[figure]) for figure in ceilings)


def gate_fails(figures: Figures, gate: Gate) -> bool:
    """Whether any static rule can fail; `static_reason` then says which, in order."""
    for figure, ceiling, required in gate:
        value = getattr(figures, figure)
        if value is None:
            if required:
                return True
        elif ceiling is not None and value > ceiling:
            return True
    return False


def has_budgets(limits: Limits) -> bool:
    """Whether the scope keeps invocation budgets (attempts, cost or tokens per budget id)."""
    return (
        limits.max_attempts is not None
        or limits.max_cost_usd is not None
        or limits.max_tokens is not None
    )


def budget_reason(
    figures: Figures,
    limits: Limits,
    attempts_used: int,
    cost_used: float,
    tokens_used: int,
) -> str | None:
    """Why one scope's invocation budgets cannot take this dispatch (`attempts`, `cost`,
    `tokens`), given what the budget id has already used there; None when they can."""
    bound = limits.max_attempts
    if bound is not None and attempts_used + figures.attempts > bound:
        return "attempts"
    money, cost = limits.max_cost_usd, figures.cost
    if money is not None and cost is not None and cost_used + cost > money + EPSILON:
        return "cost"
    bound = limits.max_tokens
    if bound is not None and figures.tokens is not None and tokens_used + figures.tokens > bound:
        return "tokens"
    return None
