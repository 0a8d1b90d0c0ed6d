"""The read path of evaluation and load runs, for the API and the admin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Exists, OuterRef, QuerySet

from admission.models import ProfileVersion, Workspace
from evaluator.engine.receipts import pending_slots
from evaluator.models import EvaluationRun, LoadRun, Receipt, ReceiptSlot


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
    *,
    workspace: Workspace,
    since: Any,
    until: Any = None,
    finished_from: Any = None,
    finished_before: Any = None,
) -> Iterator[tuple[str | None, list[dict[str, Any]]]]:
    """(profile version, attempts) of the workspace's evaluation runs started in the window
    and finished in [`finished_from`, `finished_before`) (None: open), in finishing order:
    what a canary comparison counts, read a chunk at a time."""
    runs = EvaluationRun.objects.filter(
        workspace=workspace, started_at__gte=since, finished_at__isnull=False
    )
    if until is not None:
        runs = runs.filter(started_at__lte=until)
    if finished_from is not None:
        runs = runs.filter(finished_at__gte=finished_from)
    if finished_before is not None:
        runs = runs.filter(finished_at__lt=finished_before)
    rows = runs.order_by("finished_at", "id").values_list("profile_version", "attempts")
    for version, attempts in rows.iterator(chunk_size=200):
        yield version, list(attempts or [])


@dataclass(frozen=True, slots=True)
class RunProgress:
    """How far an evaluation run got: decisions done of the total, each done decision's status,
    every attempt so far with its admission evidence (``decisionId`` added), every call
    dispatched and not answered yet, and the most calls the run's receipt ever had in flight."""

    decisions_total: int
    decisions_done: int
    outcomes: dict[str, int]
    attempts: list[dict[str, Any]]
    in_flight: list[dict[str, Any]]
    max_in_flight: int = 0

    @property
    def refusals(self) -> dict[str, int]:
        """Admission refusals by reason, over every attempt: those that ended an attempt and
        those an attempt waited through (refusals caused by our own infrastructure)."""
        counts: dict[str, int] = {}
        for attempt in self.attempts:
            evidence = attempt.get("evidence") or {}
            if not attempt.get("sent") and evidence.get("decision") == "reject":
                reason = str(attempt.get("reason"))
                if reason not in (attempt.get("infrastructureRefusals") or {}):
                    counts[reason] = counts.get(reason, 0) + 1
            for reason, count in (attempt.get("infrastructureRefusals") or {}).items():
                counts[reason] = counts.get(reason, 0) + int(count)
        return dict(sorted(counts.items()))

    @property
    def outage(self) -> dict[str, Any] | None:
        """What an outage of our own infrastructure did to the run, None when it met none:
        refusals by reason, the decisions it delayed, and those whose deadline passed while
        they waited (they ended `timeout`)."""
        refusals: dict[str, int] = {}
        delayed: set[str] = set()
        timed_out: set[str] = set()
        waited_ms = 0.0
        for attempt in self.attempts:
            met = attempt.get("infrastructureRefusals") or {}
            if not met:
                continue
            for reason, count in met.items():
                refusals[reason] = refusals.get(reason, 0) + int(count)
            delayed.add(attempt["decisionId"])
            waited_ms += float(attempt.get("infrastructureWaitMs") or 0.0)
            if not attempt.get("sent") and attempt.get("reason") in met:
                timed_out.add(attempt["decisionId"])
        if not refusals:
            return None
        return {
            "refusals": dict(sorted(refusals.items())),
            "decisionsDelayed": len(delayed),
            "decisionsUnanswered": len(timed_out),
            "waitedMs": round(waited_ms, 1),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "decisionsTotal": self.decisions_total,
            "decisionsDone": self.decisions_done,
            "outcomes": self.outcomes,
            "attempts": len(self.attempts),
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "refusals": self.refusals,
            "outage": self.outage,
        }


def evaluation_run_progress(run: EvaluationRun) -> RunProgress:
    """A run's progress: from its result once it has one, otherwise from its receipt, which the
    worker writes at every dispatch and every attempt (so it moves while the run runs)."""
    if run.result is not None:
        decisions = run.result.get("decisions") or []
        most = _receipt_of(run).values_list("document__maxPendingDispatches", flat=True).first()
        return _progress(
            run.decision_count, decisions, list(run.attempts or []), [], int(most or 0)
        )
    receipt = _receipt_of(run).only("document").first()
    if receipt is None:
        return RunProgress(run.decision_count, 0, {}, [], [])
    document = receipt.full_document()
    entries = document.get("decisions") or []
    attempts = [
        {"decisionId": entry["decisionId"], **attempt}
        for entry in entries
        for attempt in entry.get("attempts") or ()
    ]
    # Every call sent and not answered yet, in ruleset order.
    in_flight = [
        {
            "decisionId": slot.get("decisionId"),
            "adapterId": slot.get("adapterId"),
            "model": slot.get("model"),
            "number": slot.get("number"),
            "evidence": slot.get("evidence"),
        }
        for slot in sorted(pending_slots(document), key=lambda slot: slot.get("decisionIndex", 0))
    ]
    # A slot write lands before the document write that raises the most at once.
    maximum = max(int(document.get("maxPendingDispatches") or 0), len(in_flight))
    return _progress(run.decision_count, entries, attempts, in_flight, maximum)


def with_pending_dispatches(receipts: QuerySet[Receipt]) -> QuerySet[Receipt]:
    """``receipts`` with the count of their pending-dispatch slots (``Receipt.pending_dispatches``
    reads it without a query of its own)."""
    return receipts.annotate(slot_count=Count("slots"))


def receipts_in_flight(receipts: QuerySet[Receipt], *, in_flight: bool) -> QuerySet[Receipt]:
    """Those of ``receipts`` with a pending-dispatch slot (``in_flight``), or those without."""
    has_slot = Exists(ReceiptSlot.objects.filter(receipt=OuterRef("pk")))
    return receipts.filter(has_slot if in_flight else ~has_slot)


def _receipt_of(run: EvaluationRun) -> QuerySet[Receipt]:
    return Receipt.objects.filter(
        workspace_id=run.workspace.key,
        invocation_id=run.invocation_id,
        principal_id=run.principal_id,
    )


def _progress(
    total: int,
    decisions: list[dict[str, Any]],
    attempts: list[dict[str, Any]],
    in_flight: list[dict[str, Any]],
    max_in_flight: int,
) -> RunProgress:
    outcomes: dict[str, int] = {}
    for decision in decisions:
        status = decision.get("status")
        if status is not None:
            outcomes[status] = outcomes.get(status, 0) + 1
    done = sum(outcomes.values())
    return RunProgress(
        total or len(decisions),
        done,
        dict(sorted(outcomes.items())),
        attempts,
        in_flight,
        max_in_flight,
    )
