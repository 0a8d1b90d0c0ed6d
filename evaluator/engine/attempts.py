"""One attempt of one decision on one target: estimate, admission, dispatch, release, record.

Admission happens before every attempt. A rejection is an attempt that was not sent; only an
attempt that really was dispatched and has no known outcome is ``execution-uncertain``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from admission.core import (
    AdmissionController,
    AdmissionRejected,
    AdmissionRequest,
    CancelSignal,
    ShadowAdmission,
    ShadowCall,
)
from admission.core.rules import count_or_none, valid_amount
from evaluator.engine.adapters.base import (
    CLIENT_ERROR,
    CONNECT_ERROR,
    MISCONFIGURED,
    RATE_LIMITED,
    UNCERTAIN,
    Adapter,
    AdapterCall,
    AdapterError,
)
from evaluator.engine.estimates import EstimateFn
from evaluator.engine.outcomes import (
    ESTIMATE_FAILED,
    EXECUTION_UNCERTAIN,
    INVALID_OUTPUT,
    PROVIDER_ERROR,
    SUCCEEDED,
    AttemptRecord,
    outcome_for_rejection,
)
from evaluator.engine.outputs import InvalidOutputError
from evaluator.engine.receipts import ReceiptJournal
from evaluator.engine.rulesets import Decision, Target
from evaluator.engine.telemetry import EvaluatorTelemetry

__all__ = ["TARGET_DEADLINE", "TOTAL_DEADLINE", "AttemptContext", "is_deadline", "run_attempt"]

logger = logging.getLogger(__name__)

TOTAL_DEADLINE = "evaluation-deadline"
TARGET_DEADLINE = "target-deadline"
_DEADLINE_REASONS = frozenset({TOTAL_DEADLINE, TARGET_DEADLINE, "deadline-exceeded"})
_NOT_PROCESSED = frozenset({RATE_LIMITED, CLIENT_ERROR, CONNECT_ERROR, MISCONFIGURED})


def is_deadline(reason: str | None) -> bool:
    """Whether a signal fired because time ran out rather than because someone cancelled."""
    return reason in _DEADLINE_REASONS


@dataclass(slots=True)
class AttemptContext:
    """What every attempt of one evaluation shares."""

    controller: AdmissionController
    adapters: Mapping[str, Adapter]
    budget_id: str
    principal_id: str
    workspace_id: str
    run_signal: CancelSignal
    deadline_ms: float | None
    clock: Any
    origin_ms: float
    estimate: EstimateFn
    telemetry: EvaluatorTelemetry | None
    journal: ReceiptJournal | None
    # The workspace's shadow when the run started: every admission request is mirrored to it.
    shadow: ShadowAdmission | None = None

    def elapsed_ms(self) -> float:
        return self.clock.monotonic_ms() - self.origin_ms


class _SignalFired(Exception):
    """The composed signal cut an adapter call short."""


async def run_attempt(
    ctx: AttemptContext,
    index: int,
    decision: Decision,
    prompt: str,
    target_index: int,
    target: Target,
    number: int,
) -> tuple[AttemptRecord, Any]:
    """Run one attempt; returns its record and, when it succeeded, the parsed output."""
    started = ctx.elapsed_ms()
    base: dict[str, Any] = {
        "target_index": target_index,
        "adapter_id": target.adapter,
        "model": target.model,
        "number": number,
    }
    try:
        estimate = ctx.estimate(decision, target, prompt)
    except Exception:
        # A failing host estimate stops the attempt before anything is sent.
        logger.exception("estimate callback failed for decision %s", decision.id)
        record = AttemptRecord(
            **base,
            sent=False,
            outcome=ESTIMATE_FAILED,
            reason="estimate-error",
            started_ms=started,
            ended_ms=ctx.elapsed_ms(),
        )
        return record, None
    # One composed signal per attempt: the run's (caller, total deadline) and a target timer.
    signal = CancelSignal.any(ctx.run_signal)
    timer = asyncio.get_running_loop().call_later(
        target.timeout_ms / 1000.0, signal.cancel, TARGET_DEADLINE
    )
    deadline = ctx.clock.monotonic_ms() + target.timeout_ms
    if ctx.deadline_ms is not None:
        deadline = min(deadline, ctx.deadline_ms)
    request = AdmissionRequest(
        ctx.budget_id,
        ctx.principal_id,
        ctx.workspace_id,
        target.adapter,
        estimate,
        deadline_ms=deadline,
        signal=signal,
    )
    span = ctx.telemetry.start(request, target.adapter) if ctx.telemetry is not None else None
    mirror = ctx.shadow.mirror(request, retry=number > 1) if ctx.shadow is not None else None
    try:
        try:
            lease = await ctx.controller.acquire(request)
        except AdmissionRejected as rejection:
            if mirror is not None:
                mirror.rejected(rejection)
            if span is not None:
                span.rejected(rejection)
            deadline_fired = is_deadline(signal.reason)
            record = AttemptRecord(
                **base,
                sent=False,
                outcome=outcome_for_rejection(rejection.reason, deadline_fired=deadline_fired),
                reason=rejection.reason,
                retryable=rejection.retryable,
                evidence=rejection.evidence.to_dict() if rejection.evidence is not None else None,
                retry_after_ms=rejection.retry_after_ms,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
            )
            return record, None
        except BaseException:
            if mirror is not None:
                mirror.abandoned()
            if span is not None:
                span.abandoned()
            raise
        if mirror is not None:
            mirror.admitted(lease)
        if span is not None:
            span.admitted(lease.evidence)
        return await _dispatch(
            ctx, index, decision, prompt, target, number, lease, signal, span, base, started, mirror
        )
    finally:
        timer.cancel()
        signal.dispose()


async def _dispatch(
    ctx: AttemptContext,
    index: int,
    decision: Decision,
    prompt: str,
    target: Target,
    number: int,
    lease: Any,
    signal: CancelSignal,
    span: Any,
    base: dict[str, Any],
    started: float,
    mirror: ShadowCall | None,
) -> tuple[AttemptRecord, Any]:
    evidence = lease.evidence.to_dict()
    success: bool | None = None
    retry_after_ms: float | None = None
    pause_ms: float | None = None
    tokens: int | None = None
    cost: float | None = None
    output: Any = None
    try:
        if ctx.journal is not None:
            provisional = AttemptRecord(
                **base,
                sent=True,
                outcome=EXECUTION_UNCERTAIN,
                reason="dispatched",
                evidence=evidence,
                started_ms=started,
            )
            await ctx.journal.mark_dispatch(index, provisional)
        call = AdapterCall(decision.id, prompt, target, decision.output, number, signal)
        try:
            response = await _invoke(ctx.adapters[target.adapter], call, signal)
        except AdapterError as error:
            success = None if error.provider_failure is None else not error.provider_failure
            if error.kind == RATE_LIMITED:
                retry_after_ms = error.retry_after_ms
            elif error.retry_after_ms is not None:
                pause_ms = error.retry_after_ms
            tokens = count_or_none(error.total_tokens)
            if error.kind in _NOT_PROCESSED and tokens is None:
                # Refused or never delivered: the provider used nothing, so nothing stays reserved.
                tokens, cost = 0, 0.0
            outcome = EXECUTION_UNCERTAIN if error.kind == UNCERTAIN else _error_outcome(error)
            record = AttemptRecord(
                **base,
                sent=error.sent,
                outcome=outcome,
                reason=error.reason,
                retryable=error.retryable,
                evidence=evidence,
                retry_after_ms=error.retry_after_ms,
                tokens=tokens,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
                cost_usd=cost,
            )
        except _SignalFired:
            cause = "timeout" if is_deadline(signal.reason) else "cancelled"
            record = AttemptRecord(
                **base,
                sent=True,
                outcome=EXECUTION_UNCERTAIN,
                reason=cause,
                retryable=True,
                evidence=evidence,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
            )
        except Exception as error:
            # The adapter broke after dispatch: nobody knows whether the provider acted.
            logger.warning(
                "adapter %s raised %s for decision %s",
                target.adapter,
                type(error).__name__,
                decision.id,
            )
            record = AttemptRecord(
                **base,
                sent=True,
                outcome=EXECUTION_UNCERTAIN,
                reason="adapter-exception",
                retryable=True,
                evidence=evidence,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
            )
        else:
            success = True
            tokens = count_or_none(response.total_tokens)
            cost = response.cost_usd
            if cost is None and tokens is not None and target.cost_per_token_usd is not None:
                cost = tokens * target.cost_per_token_usd
            try:
                output = decision.output.parse(response.answer)
                outcome, reason, retryable = SUCCEEDED, "answered", False
            except InvalidOutputError as error:
                outcome, reason, retryable = INVALID_OUTPUT, str(error), True
            record = AttemptRecord(
                **base,
                sent=True,
                outcome=outcome,
                reason=reason,
                retryable=retryable,
                evidence=evidence,
                tokens=tokens,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
                cost_usd=float(cost) if valid_amount(cost) else None,
            )
    finally:
        try:
            lease.release(
                success=success,
                retry_after_ms=retry_after_ms,
                actual_tokens=tokens,
                actual_cost_usd=cost if valid_amount(cost) else None,
            )
        finally:
            if pause_ms is not None:
                ctx.controller.coordinate_retry_after(target.adapter, pause_ms)
            if mirror is not None:
                mirror.released(
                    lease,
                    success=success,
                    actual_tokens=tokens,
                    actual_cost_usd=cost if valid_amount(cost) else None,
                    retry_after_ms=retry_after_ms,
                )
            if span is not None:
                span.released(lease.evidence)
    return record, output


async def _invoke(adapter: Adapter, call: AdapterCall, signal: CancelSignal) -> Any:
    """Await the adapter in this task; when the signal fires, cancel just this await."""
    if signal.cancelled:
        raise _SignalFired
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def on_fire(_signal: CancelSignal) -> None:
        nonlocal fired
        fired = True
        task.cancel()

    unsubscribe = signal.add_callback(on_fire)
    try:
        return await adapter.invoke(call)
    except asyncio.CancelledError:
        if fired:
            fired = False
            if task.uncancel() == 0:
                raise _SignalFired from None
        raise
    finally:
        unsubscribe()
        if fired:
            # The adapter swallowed our cancellation; withdraw the request so it cannot land later.
            task.uncancel()


def _error_outcome(error: AdapterError) -> str:
    return "rate-limited" if error.kind == RATE_LIMITED else PROVIDER_ERROR
