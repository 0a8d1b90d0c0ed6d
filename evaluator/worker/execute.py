"""One claimed run on the worker: prepare it, evaluate it on the loop, write what it ended with.

The runner (`evaluator.worker.runner`) calls these in order: inside `run_boundary`,
`evaluation_run_prepare` (the run's request, fresh adapters and its rollout plan, fixed at the
run boundary), then `evaluate` (on the process's event loop, with the database receipt store and
the run's cancel signal) and `run_complete` (the result and the shadow's observation, only while
the claim still holds).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, transaction

from admission.core import AdmissionRegistry
from admission.rollout.plan import RunPlan
from admission.services import rollout
from evaluator.deployment import AdapterConfigError, build_adapters
from evaluator.engine.deferrals import deferral_log
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.outcomes import EXECUTION_UNCERTAIN, EvaluationResult
from evaluator.engine.scheduler import evaluate_decision_ruleset
from evaluator.engine.telemetry import EvaluatorTelemetry
from evaluator.models import EvaluationRun
from evaluator.services import runs as services
from evaluator.services import server_clock
from evaluator.worker.cancel_watch import run_cancel_signal
from evaluator.worker.receipts_db import DatabaseReceiptStore

__all__ = [
    "Outcome",
    "RunNotStartable",
    "RunStart",
    "evaluate",
    "evaluation_run_prepare",
    "run_boundary",
    "run_complete",
    "use_telemetry",
]

logger = logging.getLogger(__name__)


def _no_telemetry() -> EvaluatorTelemetry | None:
    return None


# Where evaluations find this process's telemetry; the process's assembly sets it (config).
_telemetry_source: Callable[[], EvaluatorTelemetry | None] = _no_telemetry


def use_telemetry(source: Callable[[], EvaluatorTelemetry | None]) -> None:
    """Evaluations of this process record into what `source()` returns (None: telemetry off)."""
    global _telemetry_source
    _telemetry_source = source


class RunNotStartable(Exception):
    """A claimed run cannot start; it ends `failed` with `error_type`."""

    def __init__(self, error_type: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.error_type = error_type
        self.detail = detail
        self.field = field


@dataclass(frozen=True, slots=True)
class RunStart:
    """What a claimed run starts with: its request, fresh adapters and its rollout plan."""

    request: DecisionEvaluationRequest
    adapters: dict[str, Any]
    plan: RunPlan
    requested: bool
    # The profile version the run's registry held at its boundary (None: not read there).
    profile_version: str | None = None


@contextmanager
def run_boundary(run: EvaluationRun) -> Iterator[None]:
    """The run boundary of a claimed run, as one transaction: what the caller reads inside it
    (the registry's catch-up with the ledger, the rollout plan, the profile version) is exactly
    what stood at the instant its first start is stamped (`startedAt`, the database's clock).

    A change of what runs start under (an activation, a canary promoted...) holds the
    workspace row for update from before its own time is stamped until it commits; the boundary
    holds it for share (`rollout.run_boundary_hold`). So a run whose start is stamped before a
    promotion's time runs the version before it, and one stamped after runs the promoted one,
    with no window between. A redelivered run keeps its first `startedAt` (and its canary arm
    and kill-switch setting, `RunBoundary`).
    """
    with transaction.atomic():
        rollout.run_boundary_hold(workspace=run.workspace)
        yield
        if run.deliveries == 1:
            started = server_clock.now()
            EvaluationRun.objects.filter(pk=run.pk, claim=run.claim).update(started_at=started)
            run.started_at = started


def evaluation_run_prepare(run: EvaluationRun) -> RunStart:
    """Read a claimed run's request and adapters and fix its run boundary (the kill switch,
    shadow and canary as they stand now hold for the whole run). Raises `RunNotStartable`."""
    try:
        request = DecisionEvaluationRequest.from_dict(
            {**run.document, "invocationId": run.invocation_id},
            principal_id=run.principal_id,
            workspace_id=run.workspace.key,
        )
        adapters = build_adapters(run.workspace.key)
    except InvalidDefinitionError as error:
        raise RunNotStartable("invalid-definition", error.problem, error.field) from None
    except AdapterConfigError as error:
        raise RunNotStartable("configuration", str(error)) from None
    plan = rollout.run_plan(
        workspace=run.workspace,
        principal_id=run.principal_id,
        invocation_id=run.invocation_id,
        run_id=str(run.pk),
        pinned=request.scheduler.profile_version is not None,
    )
    requested = request.scheduler.enabled
    if not plan.scheduler_enabled(requested):
        request = dataclasses.replace(
            request, scheduler=dataclasses.replace(request.scheduler, enabled=False)
        )
    return RunStart(request, adapters, plan, requested)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an evaluation ended with: its result, the profile version it ran under and the
    shadow's tallies drained at its end."""

    result: EvaluationResult
    profile_version: str | None
    # (shadow session, active tally, shadow tally) drained when the run ended.
    shadow: tuple[Any, dict[str, Any], dict[str, Any]] | None = None


async def evaluate(
    request: DecisionEvaluationRequest,
    registry: AdmissionRegistry,
    adapters: dict[str, Any],
    *,
    store: DatabaseReceiptStore | None = None,
) -> Outcome:
    """Evaluate on the running loop with the database receipt store (resumes a receipt)."""
    if store is None:
        store = DatabaseReceiptStore()
        # The store's thread keeps its connection between runs; drop it if the server went away.
        await sync_to_async(close_old_connections, thread_sensitive=True)()
    profile = registry.current_profile(request.workspace_id)
    try:
        # The run's cancel signal fires when somebody cancels it, from any process.
        async with run_cancel_signal(request.workspace_id, request.invocation_id) as signal:
            result = await evaluate_decision_ruleset(
                dataclasses.replace(request, signal=signal),
                registry=registry,
                adapters=adapters,
                receipt_store=store,
                telemetry=_telemetry_source(),
                max_prompt_chars=settings.SLUICE_MAX_PROMPT_CHARS,
                # Usage counts deferrals by reason: each attempt's record names them.
                deferrals=deferral_log(),
            )
    finally:
        for adapter in adapters.values():
            close = getattr(adapter, "aclose", None)
            if close is not None:
                await close()
    # Drained on the loop, where the shadow counts.
    shadow = registry.shadow(request.workspace_id)
    # This run's own tallies (the shadow counts every run apart), merged from every process.
    drained = (shadow.session, *shadow.drain(request.invocation_id)) if shadow is not None else None
    return Outcome(result, profile.profile_version if profile is not None else None, drained)


def run_complete(
    run: EvaluationRun,
    outcome: Outcome,
    *,
    start: RunStart | None = None,
    claim: uuid.UUID | None = None,
) -> EvaluationRun:
    """Write a finished evaluation's result and its shadow observation (only while `claim`
    still holds the run)."""
    if claim is not None and not EvaluationRun.objects.filter(pk=run.pk, claim=claim).exists():
        logger.warning("%s is no longer held by this claim; not writing its outcome", run)
        return run
    described = None
    if start is not None:
        plan = start.plan
        if outcome.shadow is not None and plan.shadow is not None:
            session, active, would_be = outcome.shadow
            if session == plan.shadow.pk:
                rollout.shadow_observation_record(
                    session_id=session, run_id=str(run.pk), active=active, shadow=would_be
                )
        described = plan.describe(requested=start.requested)
    result = outcome.result
    status = result.status
    if status == "completed" and any(d.status == EXECUTION_UNCERTAIN for d in result.decisions):
        status = EvaluationRun.Status.EXECUTION_UNCERTAIN
    document = result.to_dict()
    attempts = []
    for decision in document["decisions"]:
        for attempt in decision.pop("attempts"):
            attempts.append({"decisionId": decision["decisionId"], **attempt})
    document["succeeded"] = result.succeeded
    if described is not None:
        document["rollout"] = described
    return services.run_finish(
        run,
        status=status,
        claim=claim,
        result=document,
        attempts=attempts,
        profile_version=outcome.profile_version,
    )
