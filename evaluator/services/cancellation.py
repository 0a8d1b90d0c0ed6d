"""Cancelling an evaluation run, for the API and the admin.

A queued run ends `cancelled` at once, in the same transaction that records the request (the
row is locked meanwhile): no worker has it, and a worker that meets it afterwards finds it
finished and leaves it alone, so it never starts. A running run gets the request recorded (who
and when, kept on the row) and stays `running` until the process running it notices
(evaluator/worker/cancel_watch.py): its waiting attempts leave their admission queues, its call in
flight is aborted, and the worker writes the run as `cancelled` with every decision's outcome.
A finished run cannot be cancelled.

Members of the workspace cancel the runs they submitted; operators (`access.CANCEL_RUNS`) cancel
anybody's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

from admission import access
from evaluator.engine.outcomes import CANCELLED, EXECUTION_UNCERTAIN
from evaluator.engine.receipts import RUNNING, pending_slots, unconfirmed_attempt, upgraded_document
from evaluator.models import EvaluationRun, Receipt
from evaluator.services import server_clock
from evaluator.services.errors import RunServiceError

__all__ = [
    "RunAlreadyFinished",
    "RunCancelNotAllowed",
    "cancel_request_save",
    "evaluation_run_cancel",
    "may_cancel",
]

logger = logging.getLogger(__name__)


class RunCancelNotAllowed(RunServiceError):
    """The caller may neither cancel this run as its submitter nor as an operator."""

    code = "permission_denied"


class RunAlreadyFinished(RunServiceError):
    """The run already ended; `status` says how."""

    code = "run-finished"

    def __init__(self, message: str, *, status: str) -> None:
        super().__init__(message)
        self.status = status


def may_cancel(user: Any, run: EvaluationRun) -> bool:
    """Whether `user` may cancel `run`: an operator of its workspace, or its submitter while
    they may still evaluate there."""
    workspace = run.workspace
    if access.can(user, access.CANCEL_RUNS, workspace):
        return True
    return run.submitted_by_id == getattr(user, "pk", None) and access.can(
        user, access.EVALUATE, workspace
    )


def evaluation_run_cancel(run: EvaluationRun, user: Any) -> EvaluationRun:
    """Cancel `run` for `user`; returns the run as it is now.

    A queued run comes back `cancelled`; a running one comes back `running` with its cancel
    request recorded (asking twice is harmless). Raises `RunCancelNotAllowed` or
    `RunAlreadyFinished`.
    """
    if not may_cancel(user, run):
        raise RunCancelNotAllowed(
            f"you may cancel only your own evaluation runs in workspace {run.workspace.key}"
        )
    with transaction.atomic():
        locked = (
            EvaluationRun.objects.select_for_update(of=("self",))
            .select_related("workspace")
            .get(pk=run.pk)
        )
        if locked.finished:
            raise RunAlreadyFinished(
                f"the run already ended ({locked.status})", status=locked.status
            )
        cancel_request_save(locked, user, before_start=_end_before_start)
    logger.info(
        "evaluation run %s: cancel requested by %s (now %s)",
        locked.pk,
        user.get_username(),
        locked.status,
    )
    return locked


def cancel_request_save(
    locked: Any, user: Any, *, before_start: Callable[[Any], list[str]] | None = None
) -> None:
    """Record `user`'s cancel on `locked` (a run of either kind, locked for update and not
    finished) and save it: the first request is the one kept; a queued run ends `cancelled` now,
    after `before_start` wrote what else such a run keeps (it returns the fields it set)."""
    now = server_clock.now()
    fields = ["updated_at"]
    if locked.cancel_requested_at is None:
        locked.cancel_requested_at = now
        locked.cancel_requested_by = user
        fields += ["cancel_requested_at", "cancel_requested_by"]
    if locked.status == type(locked).Status.QUEUED:
        if before_start is not None:
            fields += before_start(locked)
        locked.status = type(locked).Status.CANCELLED
        locked.finished_at = now
        fields += ["status", "finished_at"]
    locked.save(update_fields=fields)


def _end_before_start(run: EvaluationRun) -> list[str]:
    run.result, run.attempts = _cancelled_before_start(run)
    return ["result", "attempts"]


def _decision_ids(run: EvaluationRun) -> list[str]:
    # The document passed validation when it was submitted.
    return [decision["id"] for decision in run.document["ruleset"]["decisions"]]


def _cancelled_before_start(run: EvaluationRun) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The result of a run cancelled while queued: unfinished decisions end `cancelled`.

    A queued run usually has no receipt. One that ran before (and was queued again) keeps what
    its receipt recorded, and the receipt is closed, so a late worker cannot write to it.
    """
    receipt = (
        Receipt.objects.select_for_update()
        .filter(
            workspace_id=run.workspace.key,
            invocation_id=run.invocation_id,
            principal_id=run.principal_id,
        )
        .first()
    )
    if receipt is not None and receipt.state == RUNNING:
        # A receipt left by the previous schema is closed as v3, like any resumed run's. The
        # row lock (FOR UPDATE) keeps slot writes out until the receipt is closed.
        document = upgraded_document(receipt.full_document())
        entries = [dict(entry) for entry in document["decisions"]]
        for slot in pending_slots(document):
            # Every call that may have gone out stays what it is: sent, outcome unknown.
            entry = entries[slot["decisionIndex"]]
            entry["attempts"] = [*entry["attempts"], unconfirmed_attempt(slot).to_dict()]
            entry["status"] = EXECUTION_UNCERTAIN
        for entry in entries:
            if entry["status"] is None:
                entry["status"] = CANCELLED
        receipt.document = {
            **{name: value for name, value in document.items() if name != "pendingDispatches"},
            "decisions": entries,
            "state": CANCELLED,
            "revision": document["revision"] + 1,
            "updatedAtEpochMs": server_clock.now().timestamp() * 1000,
        }
        receipt.schema = document["schema"]
        receipt.state = CANCELLED
        receipt.revision = receipt.document["revision"]
        receipt.save()
        receipt.slots.all().delete()
    else:
        entries = [
            {"decisionId": decision_id, "status": CANCELLED, "output": None, "attempts": []}
            for decision_id in _decision_ids(run)
        ]
    attempts = [
        {"decisionId": entry["decisionId"], **attempt}
        for entry in entries
        for attempt in entry["attempts"]
    ]
    result = {
        "invocationId": run.invocation_id,
        "rulesetId": run.ruleset_id,
        "status": CANCELLED,
        "concurrency": 1,
        "maxActive": 0,
        "resumed": receipt is not None,
        "decisions": [
            {"decisionId": e["decisionId"], "status": e["status"], "output": e["output"]}
            for e in entries
        ],
        "succeeded": False,
    }
    return result, attempts
