"""The write path of evaluation and load runs: submit, and the writes that end a run.

Submitting validates everything a request can get wrong before a row exists and writes the run
`queued`: that row *is* the queue entry (workers claim runs from the database, see
evaluator/worker/runner.py and evaluator/worker/dispatch.py). When the transaction commits a
doorbell message is published so a worker looks at once; if the broker does not take it, the run is
still queued and a worker's next poll finds it. Load runs travel the same way
(evaluator/worker/load_dispatch.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Model

from admission import access, selectors
from admission.models import ProfileVersion, Workspace
from evaluator import qualification
from evaluator.deployment import AdapterConfigError, adapter_ids
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.rulesets import MAX_DECISIONS, prompt_values
from evaluator.harness.manifests import REGISTERED_MANIFESTS
from evaluator.models import EvaluationRun, LoadRun
from evaluator.services import doorbell, server_clock, usage
from evaluator.services.errors import (
    BROKER_UNAVAILABLE,
    BrokerUnavailable,
    InvalidRunRequest,
    LoadRunBacklogFull,
    LoadRunNotAllowed,
    RunServiceError,
)

__all__ = [
    "BrokerUnavailable",
    "InvalidRunRequest",
    "LoadRunBacklogFull",
    "LoadRunNotAllowed",
    "RunServiceError",
    "evaluation_run_submit",
    "load_manifest_names",
    "load_run_submit",
    "run_fail",
    "run_finish",
]

logger = logging.getLogger(__name__)

RunT = TypeVar("RunT", EvaluationRun, LoadRun)


# ------------------------------------------------------------------------ evaluation runs


def evaluation_run_submit(
    workspace: Workspace, principal_user: Any, document: Any
) -> tuple[EvaluationRun, bool]:
    """Validate `document` for the trusted caller and workspace, store the run, enqueue it.

    `principal_user` is the authenticated caller and must be a member of `workspace`; its
    username is the admission principal id. Returns `(run, created)`: a document that repeats
    an earlier `invocationId` with the same content returns that run (re-queued if the broker
    had refused it). Raises `InvalidRunRequest` (with `field`) or `BrokerUnavailable`.
    """
    if not access.can(principal_user, access.EVALUATE, workspace):
        raise InvalidRunRequest("the caller may not evaluate in this workspace", field="workspace")
    principal_id = principal_user.get_username()
    request = _parse_request(document, principal_id=principal_id, workspace=workspace)
    run_id = uuid.uuid4()
    invocation_id = document.get("invocationId") or run_id.hex
    existing = EvaluationRun.objects.filter(workspace=workspace, invocation_id=invocation_id)
    if (run := existing.first()) is not None:
        return _resubmit(run, principal_id, document), False
    try:
        with transaction.atomic():
            run = EvaluationRun.objects.create(
                id=run_id,
                workspace=workspace,
                submitted_by=principal_user,
                principal_id=principal_id,
                invocation_id=invocation_id,
                document=document,
                ruleset_id=request.ruleset.id,
                ruleset_digest=request.ruleset.digest,
                decision_count=len(request.ruleset.decisions),
                task_id=str(uuid.uuid4()),
            )
            _ring_on_commit(run)
    except IntegrityError:
        # A concurrent submission took the invocation id between the lookup and the insert.
        run = existing.first()
        if run is None:
            raise
        return _resubmit(run, principal_id, document), False
    return run, True


def _check_size(document: Any) -> None:
    """Refuse a ruleset above the deployment's `SLUICE_MAX_DECISIONS` before parsing it."""
    limit = min(settings.SLUICE_MAX_DECISIONS, MAX_DECISIONS)
    ruleset = document.get("ruleset") if isinstance(document, Mapping) else None
    decisions = ruleset.get("decisions") if isinstance(ruleset, Mapping) else None
    if isinstance(decisions, list) and len(decisions) > limit:
        raise InvalidRunRequest(
            f"holds {len(decisions)} decisions; this deployment takes at most {limit} per "
            "evaluation (SLUICE_MAX_DECISIONS)",
            field="ruleset.decisions",
        )


def _parse_request(
    document: Any, *, principal_id: str, workspace: Workspace
) -> DecisionEvaluationRequest:
    _check_size(document)
    if isinstance(document, Mapping):
        scheduler = document.get("scheduler")
        if isinstance(scheduler, Mapping) and scheduler.get("profile") is not None:
            raise InvalidRunRequest(
                "limits come from the workspace's approved profile versions, not from a request",
                field="scheduler.profile",
            )
    try:
        request = DecisionEvaluationRequest.from_dict(
            document, principal_id=principal_id, workspace_id=workspace.key
        )
    except InvalidDefinitionError as error:
        field = error.field
        if field == "principal.id":
            field = "principal"
        raise InvalidRunRequest(error.problem, field=field or "non_field_errors") from None
    try:
        known = adapter_ids(workspace.key)
    except AdapterConfigError as error:
        raise InvalidRunRequest(str(error), field="ruleset") from None
    oversized = request.ruleset.oversized_prompt(
        prompt_values(request.input), settings.SLUICE_MAX_PROMPT_CHARS
    )
    if oversized is not None:
        index, length = oversized
        raise InvalidRunRequest(
            f"renders to {length} characters with this input; this deployment sends at most "
            f"{settings.SLUICE_MAX_PROMPT_CHARS} (SLUICE_MAX_PROMPT_CHARS)",
            field=f"ruleset.decisions[{index}].prompt",
        )
    unknown = request.ruleset.unknown_adapter_field(known)
    if unknown is not None:
        raise InvalidRunRequest(
            f"names no adapter of this deployment (known: {', '.join(sorted(known))})",
            field=unknown,
        )
    if selectors.workspace_current_version(workspace=workspace) is None:
        raise InvalidRunRequest(
            "the workspace has no active admission profile; activate one first",
            field="scheduler.profile",
        )
    return request


def _resubmit(run: EvaluationRun, principal_id: str, document: Any) -> EvaluationRun:
    if run.principal_id != principal_id or run.document != document:
        raise InvalidRunRequest(
            "already names another evaluation in this workspace", field="invocationId"
        )
    refused = run.status == EvaluationRun.Status.FAILED and _error_type(run) == BROKER_UNAVAILABLE
    if not refused:
        return run
    with transaction.atomic():
        updated = EvaluationRun.objects.filter(
            pk=run.pk, status=EvaluationRun.Status.FAILED
        ).update(
            status=EvaluationRun.Status.QUEUED,
            error=None,
            finished_at=None,
            task_id=str(uuid.uuid4()),
            updated_at=server_clock.now(),
        )
        run.refresh_from_db()
        if updated:
            _ring_on_commit(run)
    return run


def _error_type(run: EvaluationRun | LoadRun) -> str | None:
    return run.error.get("type") if isinstance(run.error, dict) else None


# ------------------------------------------------------------------------------ load runs


def load_manifest_names() -> list[str]:
    """File names of the preregistered manifests under `manifests/`."""
    return sorted(entry.file_name for entry in REGISTERED_MANIFESTS.values())


def load_run_submit(
    workspace: Workspace,
    principal_user: Any,
    manifest_name: str,
    target: str,
    *,
    what_if_version: ProfileVersion | None = None,
    mapping: Any = None,
) -> LoadRun:
    """Store a load run of a preregistered manifest against a harness target, `queued`.

    With `what_if_version` it is a what-if run: the manifest's arrivals under that version's
    limits, ids mapped as `mapping` asks (evaluator/qualification.py). The row is the queue
    entry: a worker claims it fairly across workspaces (evaluator/worker/load_dispatch.py), and the
    doorbell published at commit only makes one look sooner. Every interface (API, admin,
    shell) submits here, so all go through the same backlog cap and the same fair dispatch.
    Raises `LoadRunNotAllowed`, `LoadRunBacklogFull` or `InvalidRunRequest` (field `manifest`,
    `target`, `version` or `mapping…`).
    """
    # A what-if run qualifies a proposal, so whoever may propose may ask for one.
    act = access.PROPOSE if what_if_version is not None else access.RUN_LOAD
    if not access.can(principal_user, act, workspace):
        what = "what-if runs" if what_if_version is not None else "load runs"
        raise LoadRunNotAllowed(f"you may not start {what} in workspace {workspace.key}")
    if manifest_name not in load_manifest_names():
        raise InvalidRunRequest(
            f"must be one of {', '.join(load_manifest_names())}", field="manifest"
        )
    if what_if_version is not None and what_if_version.workspace_id != workspace.pk:
        raise InvalidRunRequest("belongs to another workspace", field="version")
    try:
        qualification.check(manifest_name, target, what_if_version=what_if_version, mapping=mapping)
    except qualification.QualificationError as error:
        raise InvalidRunRequest(str(error), field=error.field) from None
    cap = int(settings.SLUICE_WORKSPACE_LOAD_RUNS_QUEUED)
    with transaction.atomic():
        # The workspace's row lock makes the backlog count and the insert one step.
        Workspace.objects.select_for_update().filter(pk=workspace.pk).first()
        waiting = LoadRun.objects.filter(workspace=workspace, status=LoadRun.Status.QUEUED)
        if waiting.count() >= cap:
            raise LoadRunBacklogFull(
                f"workspace {workspace.key} already has {cap} load runs waiting "
                "(SLUICE_WORKSPACE_LOAD_RUNS_QUEUED); start more once some have run"
            )
        run = LoadRun.objects.create(
            workspace=workspace,
            submitted_by=principal_user,
            manifest_name=manifest_name,
            target=target,
            what_if_version=what_if_version,
            mapping=mapping,
            task_id=str(uuid.uuid4()),
        )
        _ring_on_commit(run)
    return run


# --------------------------------------------------------------------------------- shared


def _ring_on_commit(run: EvaluationRun | LoadRun) -> None:
    transaction.on_commit(lambda: _ring(run))


def _ring(run: EvaluationRun | LoadRun) -> None:
    """Publish the doorbell of a committed run; a lost doorbell only costs one poll interval."""
    try:
        doorbell.ring(str(run.pk), run.task_id)
    except Exception as error:
        logger.warning(
            "%s is queued, but its doorbell was not published (%s: %s); a worker's next poll "
            "finds it",
            run,
            type(error).__name__,
            error,
        )


def run_fail(
    run: RunT,
    error_type: str,
    detail: str,
    *,
    field: str | None = None,
    claim: uuid.UUID | None = None,
) -> RunT:
    """End a run `failed` with a typed error (only while `claim`, if given, holds it)."""
    error: dict[str, Any] = {"type": error_type, "detail": detail}
    if field:
        error["field"] = field
    return run_finish(run, status="failed", error=error, claim=claim)


def run_finish(run: RunT, *, status: str, claim: uuid.UUID | None = None, **values: Any) -> RunT:
    """End a run with `status` and the row's `values` (only while `claim`, if given, holds it);
    an evaluation's usage is recorded in the same transaction."""
    model: type[Model] = type(run)
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=run.pk)  # type: ignore[attr-defined]
        if locked.finished:
            return locked
        if claim is not None and locked.claim != claim:
            # Taken back and claimed again: the current claimant writes the outcome.
            logger.warning("%s is no longer held by this claim; not writing its outcome", run)
            return locked
        locked.status = status
        locked.finished_at = server_clock.now()
        for name, value in values.items():
            setattr(locked, name, value)
        locked.save()
        if isinstance(locked, EvaluationRun):
            # In the same transaction: a run's usage counts exactly once.
            usage.usage_record_run(locked)
    return locked
