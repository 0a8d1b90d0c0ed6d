"""One attempt of one decision on one target: estimate, admission, dispatch, release, record.

Admission happens before every attempt. A rejection is an attempt that was not sent; only an
attempt that really was dispatched and has no known outcome is ``execution-uncertain``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
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
from evaluator.engine.deferrals import DeferralLog
from evaluator.engine.estimates import EstimateFn
from evaluator.engine.holds import hold_release
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

__all__ = [
    "INFRASTRUCTURE_REASONS",
    "TARGET_DEADLINE",
    "TOTAL_DEADLINE",
    "AttemptContext",
    "is_deadline",
    "run_attempt",
]

logger = logging.getLogger(__name__)

TOTAL_DEADLINE = "evaluation-deadline"
TARGET_DEADLINE = "target-deadline"
_DEADLINE_REASONS = frozenset({TOTAL_DEADLINE, TARGET_DEADLINE, "deadline-exceeded"})
_NOT_PROCESSED = frozenset({RATE_LIMITED, CLIENT_ERROR, CONNECT_ERROR, MISCONFIGURED})
# Refusals caused by our own infrastructure rather than the profile: waited out, never failed.
INFRASTRUCTURE_REASONS = frozenset({"coordination-unavailable"})
# The pause between two admission requests of an attempt that meets such a refusal: it doubles
# from the first to the most (with jitter), so an outage's end is noticed within about a second.
OUTAGE_BACKOFF_FIRST_MS = 100.0
OUTAGE_BACKOFF_MAX_MS = 1_000.0


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
    # Notes why each attempt's admission request was deferred (the record says so).
    deferrals: DeferralLog | None = None

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
    """Run one attempt; returns its record and, when it succeeded, the parsed output.

    Its parameters are where the attempt stands in the run (the decision, its rendered prompt,
    the target and the attempt's number), which the scheduler and the records both need as
    they are; the steps (estimate, admission, dispatch) read top to bottom in one place."""
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
    outage = _OutageWait()
    deferrals = ctx.deferrals
    if deferrals is not None:
        deferrals.follow(request)
    try:
        try:
            lease = await _acquire(ctx, request, signal, outage)
        except AdmissionRejected as rejection:
            if deferrals is not None:
                waited = rejection.evidence.queue_delay_ms if rejection.evidence else None
                base["deferred_by"] = tuple(deferrals.reasons(request, waited)) or None
                deferrals = None
            if mirror is not None:
                mirror.rejected(rejection)
            if span is not None:
                span.rejected(rejection)
            deadline_fired = is_deadline(signal.reason)
            if rejection.reason in INFRASTRUCTURE_REASONS:
                # Waited out until the signal fired: a deadline (`timeout`) or a cancel.
                outcome = outcome_for_rejection("cancelled", deadline_fired=deadline_fired)
                retryable = False
            else:
                outcome = outcome_for_rejection(rejection.reason, deadline_fired=deadline_fired)
                retryable = rejection.retryable
            record = AttemptRecord(
                **base,
                sent=False,
                outcome=outcome,
                reason=rejection.reason,
                retryable=retryable,
                evidence=rejection.evidence.to_dict() if rejection.evidence is not None else None,
                retry_after_ms=rejection.retry_after_ms,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
            )
            return outage.noted(record), None
        except BaseException:
            if deferrals is not None:
                deferrals.reasons(request, None)
                deferrals = None
            if mirror is not None:
                mirror.abandoned()
            if span is not None:
                span.abandoned()
            raise
        if deferrals is not None:
            waited = lease.evidence.queue_delay_ms
            base["deferred_by"] = tuple(deferrals.reasons(request, waited)) or None
            deferrals = None
        if mirror is not None:
            mirror.admitted(lease)
        if span is not None:
            span.admitted(lease.evidence)
        record, output = await _dispatch(
            ctx,
            index,
            decision,
            prompt,
            target,
            number,
            lease,
            signal,
            span,
            base,
            started,
            mirror,
            deadline,
        )
        return outage.noted(record), output
    finally:
        timer.cancel()
        signal.dispose()


class _OutageWait:
    """Refusals by our own infrastructure that one attempt waited through."""

    __slots__ = ("refusals", "waited_ms")

    def __init__(self) -> None:
        self.refusals: dict[str, int] = {}
        self.waited_ms = 0.0

    def noted(self, record: AttemptRecord) -> AttemptRecord:
        if not self.refusals:
            return record
        return dataclasses.replace(
            record,
            infrastructure_refusals=dict(self.refusals),
            infrastructure_wait_ms=round(self.waited_ms, 3),
        )


async def _acquire(
    ctx: AttemptContext, request: AdmissionRequest, signal: CancelSignal, outage: _OutageWait
) -> Any:
    """Admission for one attempt. A refusal caused by our own infrastructure (shared admission
    state unreachable) is not the attempt's fault and costs no attempt: it is asked again, with
    a growing pause, until admission answers or the attempt's signal fires (its deadline, the
    run's, a cancel); the last such refusal is raised then."""
    pause_ms = OUTAGE_BACKOFF_FIRST_MS
    while True:
        try:
            return await ctx.controller.acquire(request)
        except AdmissionRejected as rejection:
            if rejection.reason not in INFRASTRUCTURE_REASONS or signal.cancelled:
                raise
            outage.refusals[rejection.reason] = outage.refusals.get(rejection.reason, 0) + 1
            began = ctx.clock.monotonic_ms()
            fired = await _pause(signal, pause_ms * (0.5 + random.random() / 2))
            outage.waited_ms += ctx.clock.monotonic_ms() - began
            if fired:
                raise
            pause_ms = min(OUTAGE_BACKOFF_MAX_MS, pause_ms * 2)


async def _pause(signal: CancelSignal, wait_ms: float) -> bool:
    """Wait ``wait_ms`` unless ``signal`` fires first; True when it fired."""
    if signal.cancelled:
        return True
    loop = asyncio.get_running_loop()
    wake: asyncio.Future[bool] = loop.create_future()

    def settle(value: bool) -> None:
        if not wake.done():
            wake.set_result(value)

    timer = loop.call_later(wait_ms / 1000.0, settle, False)
    unsubscribe = signal.add_callback(lambda _signal: settle(True))
    try:
        return await wake
    finally:
        timer.cancel()
        unsubscribe()


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
    hold_until_ms: float,
) -> tuple[AttemptRecord, Any]:
    """Send one admitted attempt to its adapter and settle its lease, receipt and shadow call.

    Long, and with many parameters, on purpose: everything between the admission and the
    lease's release is one critical section (the receipt journal's dispatch mark, the call under
    the cancel signal, and the lease's release with the span and the shadow call), and
    `run_attempt` has already computed each argument once; splitting it would hand the same
    state around in pieces."""
    evidence = lease.evidence.to_dict()
    adapter = ctx.adapters[target.adapter]
    # A provider that documents stopping work on an aborted call sooner shortens the hold.
    cutoff_ms = getattr(adapter, "abort_cutoff_ms", None)

    def hold_end() -> float:
        if cutoff_ms is None:
            return hold_until_ms
        return min(hold_until_ms, ctx.clock.monotonic_ms() + cutoff_ms)

    # Set while the adapter call is under way: leaving then means the call was aborted.
    calling = False
    # Why the permit outlives an aborted call that may still run at the provider.
    hold_reason: str | None = None
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
        calling = True
        try:
            response = await _invoke(adapter, call, signal)
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
            held = None
            cause = "timeout" if is_deadline(signal.reason) else "cancelled"
            if cause == "cancelled" and hold_end() > ctx.clock.monotonic_ms():
                hold_reason = signal.reason or cause
                held = _hold_evidence(ctx, hold_reason, hold_end())
            record = AttemptRecord(
                **base,
                sent=True,
                outcome=EXECUTION_UNCERTAIN,
                reason=cause,
                retryable=True,
                evidence=evidence,
                started_ms=started,
                ended_ms=ctx.elapsed_ms(),
                permit_held=held,
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
        calling = False
    finally:
        if calling:
            # This task was stopped mid-call (its run was taken away, or the worker stops).
            hold_reason = "call-abandoned"

        def release() -> None:
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

        if hold_reason is None:
            release()
        else:
            hold_s = (hold_end() - ctx.clock.monotonic_ms()) / 1000.0
            if hold_s > 0:
                logger.warning(
                    "call to %s for decision %s aborted (%s) after it may have reached the "
                    "provider: its permit is held %.1f s more, until the call's timeout",
                    target.adapter,
                    decision.id,
                    hold_reason,
                    hold_s,
                )
            hold_release(hold_s, release)
    return record, output


def _hold_evidence(ctx: AttemptContext, reason: str, until_ms: float) -> dict[str, Any]:
    """What an aborted attempt's record says about its permit: held, why, until when."""
    return {"reason": reason, "untilMs": until_ms - ctx.origin_ms}


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
