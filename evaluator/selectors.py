"""The read path of evaluation and load runs, for the API and the admin."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from admission.models import ProfileVersion, Workspace
from evaluator.models import EvaluationRun, LoadRun, Receipt


def evaluation_run_list(
    *, workspace: Workspace, status: str | None = None
) -> QuerySet[EvaluationRun]:
    """A workspace's evaluation runs, newest first."""
    runs = EvaluationRun.objects.filter(workspace=workspace).select_related(
        "workspace", "submitted_by", "cancel_requested_by"
    )
    if status:
        runs = runs.filter(status=status)
    return runs.order_by("-created_at", "-id")


def evaluation_run_get(*, workspace: Workspace, run_id: str) -> EvaluationRun | None:
    """One run of the workspace by id, or None (also for a malformed id)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return evaluation_run_list(workspace=workspace).filter(pk=key).first()


def load_run_list(*, workspace: Workspace) -> QuerySet[LoadRun]:
    """A workspace's load runs, newest first."""
    return (
        LoadRun.objects.filter(workspace=workspace)
        .select_related("workspace", "submitted_by", "what_if_version", "cancel_requested_by")
        .order_by("-created_at", "-id")
    )


def load_run_get(*, workspace: Workspace, run_id: str) -> LoadRun | None:
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return load_run_list(workspace=workspace).filter(pk=key).first()


def what_if_run_list(*, version: ProfileVersion) -> QuerySet[LoadRun]:
    """The what-if runs of one profile version, newest first."""
    return (
        LoadRun.objects.filter(what_if_version=version)
        .select_related("workspace", "submitted_by", "what_if_version", "cancel_requested_by")
        .order_by("-created_at", "-id")
    )


def run_admissions_since(
    *, workspace: Workspace, since: Any, until: Any = None
) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """(profile version, attempts) of the workspace's finished evaluation runs started in the
    window, oldest first: what a canary comparison counts."""
    runs = EvaluationRun.objects.filter(
        workspace=workspace, started_at__gte=since, finished_at__isnull=False
    )
    if until is not None:
        runs = runs.filter(started_at__lte=until)
    return [
        (version, list(attempts or []))
        for version, attempts in runs.order_by("started_at", "id").values_list(
            "profile_version", "attempts"
        )
    ]


@dataclass(frozen=True, slots=True)
class RunProgress:
    """How far an evaluation run got: decisions done of the total, each done decision's status,
    every attempt so far with its admission evidence (``decisionId`` added), and the attempt
    dispatched and not yet answered, if any."""

    decisions_total: int
    decisions_done: int
    outcomes: dict[str, int]
    attempts: list[dict[str, Any]]
    in_flight: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "decisionsTotal": self.decisions_total,
            "decisionsDone": self.decisions_done,
            "outcomes": self.outcomes,
            "attempts": len(self.attempts),
            "inFlight": self.in_flight,
        }


def evaluation_run_progress(run: EvaluationRun) -> RunProgress:
    """A run's progress: from its result once it has one, otherwise from its receipt, which the
    worker writes at every dispatch and every attempt (so it moves while the run runs)."""
    if run.result is not None:
        decisions = run.result.get("decisions") or []
        return _progress(run.decision_count, decisions, list(run.attempts or []), None)
    receipt = (
        Receipt.objects.filter(
            workspace_id=run.workspace.key,
            invocation_id=run.invocation_id,
            principal_id=run.principal_id,
        )
        .only("document")
        .first()
    )
    if receipt is None:
        return RunProgress(run.decision_count, 0, {}, [], None)
    entries = receipt.document.get("decisions") or []
    attempts = [
        {"decisionId": entry["decisionId"], **attempt}
        for entry in entries
        for attempt in entry.get("attempts") or ()
    ]
    in_flight = None
    slot = receipt.document.get("pendingDispatch")
    if slot is not None and 0 <= slot.get("decisionIndex", -1) < len(entries):
        in_flight = {
            "decisionId": entries[slot["decisionIndex"]]["decisionId"],
            "adapterId": slot.get("adapterId"),
            "model": slot.get("model"),
            "number": slot.get("number"),
            "evidence": slot.get("evidence"),
        }
    return _progress(run.decision_count, entries, attempts, in_flight)


def _progress(
    total: int,
    decisions: list[dict[str, Any]],
    attempts: list[dict[str, Any]],
    in_flight: dict[str, Any] | None,
) -> RunProgress:
    outcomes: dict[str, int] = {}
    for decision in decisions:
        status = decision.get("status")
        if status is not None:
            outcomes[status] = outcomes.get(status, 0) + 1
    done = sum(outcomes.values())
    return RunProgress(
        total or len(decisions), done, dict(sorted(outcomes.items())), attempts, in_flight
    )
