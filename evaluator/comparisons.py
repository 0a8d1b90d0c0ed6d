"""Comparisons an operator reads beside a shadow or a canary, for the admin and the API.

A shadow's comparison comes from its own observations (`rollout.shadow_comparison`); a canary's
from the evaluation runs that started while it ran, which are the evaluator's rows.
"""

from __future__ import annotations

from typing import Any

from admission.models import RolloutEvent
from admission.services import rollout
from evaluator import selectors as evaluator_selectors


def canary_comparison(canary: RolloutEvent) -> rollout.Comparison:
    """Current version against the canary over the canary's window (still open, or closed)."""
    closing = canary.closings.order_by("id").first()

    def runs_between(finished_from: Any, finished_before: Any) -> Any:
        return evaluator_selectors.run_admissions_since(
            workspace=canary.workspace,
            since=canary.at,
            until=closing.at if closing is not None else None,
            finished_from=finished_from,
            finished_before=finished_before,
        )

    return rollout.canary_runs_comparison(canary=canary, runs_between=runs_between)


def session_comparison(event: RolloutEvent) -> rollout.Comparison:
    """The comparison of a shadow or canary start row."""
    if event.kind == RolloutEvent.Kind.CANARY_START:
        return canary_comparison(event)
    return rollout.shadow_comparison(session=event)
