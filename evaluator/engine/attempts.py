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
    "AttemptPlace",
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


@dataclass(frozen=True, slots=True)
class AttemptPlace:
    """Where one attempt stands in its run: the decision (and its index in the ruleset, which
    names its receipts), its rendered prompt, the target (and its index) and the attempt's
    number on that target."""

    index: int
    decision: Decision
    prompt: str
    target_index: int
    target: Target
    number: int


async def run_attempt(ctx: AttemptContext, place: AttemptPlace) -> tuple[AttemptRecord, Any]:
    """Run one attempt; returns its record and, when it succeeded, the parsed output.

    The phases, in this order: the estimate (a failing one sends nothing), the admission request
    under the attempt's own signal (the run's signal and the target's timer), and for an
    admitted attempt the dispatch (`_Call`)."""
    started = ctx.elapsed_ms()
    target = place.target
    base: dict[str, Any] = {
        "target_index": place.target_index,
        "adapter_id": target.adapter,
        "model": target.model,
        "number": place.number,
    }
    try:
        estimate = ctx.estimate(place.decision, target, place.prompt)
    except Exception:
        # A failing host estimate stops the attempt before anything is sent.
        logger.exception("estimate callback failed for decision %s", place.decision.id)
        record = AttemptRecord(
            **base,
            sent=False,
            outcome=ESTIMATE_FAILED,
            reason="estimate-error",
            started_ms=started,
            ended_ms=ctx.elapsed_ms(),
        )
        return record, None
    attempt = _Attempt.open(ctx, place, estimate, base, started)
    try:
        try:
            lease = await _acquire(ctx, attempt.request, attempt.signal, attempt.outage)
        except AdmissionRejected as rejection:
            return attempt.outage.noted(attempt.rejected(rejection)), None
        except BaseException:
            attempt.abandoned()
            raise
        attempt.admitted(lease)
        record, output = await _Call(attempt, lease).run()
        return attempt.outage.noted(record), output
    finally:
        attempt.timer.cancel()
        attempt.signal.dispose()


@dataclass(slots=True)
class _Attempt:
    """One estimated attempt: its request and signal, and who watches its admission (the
    telemetry span, the shadow's mirror, the deferral log, the outage wait). Its fields are not
    changed once it is open (not frozen only because a frozen class is slower to build, and
    this is built for every provider call)."""

    ctx: AttemptContext
    place: AttemptPlace
    # The record's fields that every outcome of this attempt shares.
    base: dict[str, Any]
    started: float
    signal: CancelSignal
    timer: asyncio.TimerHandle
    # The attempt's deadline; an aborted call's permit is held until then at most.
    deadline: float
    request: AdmissionRequest
    span: Any
    mirror: ShadowCall | None
    outage: _OutageWait

    @classmethod
    def open(
        cls,
        ctx: AttemptContext,
        place: AttemptPlace,
        estimate: Any,
        base: dict[str, Any],
        started: float,
    ) -> _Attempt:
        """Compose the attempt's signal (the run's, and a timer for the target's timeout), its
        request, and start the span, the mirror and the deferral log's watch on it."""
        target = place.target
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
        retry = place.number > 1
        mirror = ctx.shadow.mirror(request, retry=retry) if ctx.shadow is not None else None
        outage = _OutageWait()
        if ctx.deferrals is not None:
            ctx.deferrals.follow(request)
        return cls(
            ctx, place, base, started, signal, timer, deadline, request, span, mirror, outage
        )

    def _deferred_by(self, waited_ms: float | None) -> None:
        deferrals = self.ctx.deferrals
        if deferrals is not None:
            self.base["deferred_by"] = tuple(deferrals.reasons(self.request, waited_ms)) or None

    def rejected(self, rejection: AdmissionRejected) -> AttemptRecord:
        """Tell the watchers, and record the refusal (waited out when our own infrastructure
        refused, until the signal fired: a deadline or a cancel)."""
        self._deferred_by(rejection.evidence.queue_delay_ms if rejection.evidence else None)
        if self.mirror is not None:
            self.mirror.rejected(rejection)
        if self.span is not None:
            self.span.rejected(rejection)
        deadline_fired = is_deadline(self.signal.reason)
        if rejection.reason in INFRASTRUCTURE_REASONS:
            outcome = outcome_for_rejection("cancelled", deadline_fired=deadline_fired)
            retryable = False
        else:
            outcome = outcome_for_rejection(rejection.reason, deadline_fired=deadline_fired)
            retryable = rejection.retryable
        return AttemptRecord(
            **self.base,
            sent=False,
            outcome=outcome,
            reason=rejection.reason,
            retryable=retryable,
            evidence=rejection.evidence.to_dict() if rejection.evidence is not None else None,
            retry_after_ms=rejection.retry_after_ms,
            started_ms=self.started,
            ended_ms=self.ctx.elapsed_ms(),
        )

    def abandoned(self) -> None:
        """The admission request was left (the task stopped): the watchers hear so."""
        if self.ctx.deferrals is not None:
            self.ctx.deferrals.reasons(self.request, None)
        if self.mirror is not None:
            self.mirror.abandoned()
        if self.span is not None:
            self.span.abandoned()

    def admitted(self, lease: Any) -> None:
        """Admission granted `lease`: the watchers hear so before anything is sent."""
        self._deferred_by(lease.evidence.queue_delay_ms)
        if self.mirror is not None:
            self.mirror.admitted(lease)
        if self.span is not None:
            self.span.admitted(lease.evidence)


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


class _Call:
    """One admitted attempt sent to its adapter, and its lease settled afterwards.

    In this order: the receipt journal marks the slot dispatched (durable before the adapter
    is called), the adapter is called under the attempt's signal, the outcome is recorded, and
    the lease is released (with the span and the shadow call) at once, or after a hold when the
    call was aborted while the provider may still work on it. What the outcome learned
    (success, tokens, cost, pauses) is kept here for the release, which may run later."""

    __slots__ = (
        "adapter",
        "attempt",
        "cost",
        "cutoff_ms",
        "evidence",
        "hold_reason",
        "lease",
        "pause_ms",
        "retry_after_ms",
        "success",
        "tokens",
    )

    def __init__(self, attempt: _Attempt, lease: Any) -> None:
        self.attempt = attempt
        self.lease = lease
        self.evidence = lease.evidence.to_dict()
        self.adapter = attempt.ctx.adapters[attempt.place.target.adapter]
        # A provider that documents stopping work on an aborted call sooner shortens the hold.
        self.cutoff_ms: float | None = getattr(self.adapter, "abort_cutoff_ms", None)
        # Why the permit outlives an aborted call that may still run at the provider.
        self.hold_reason: str | None = None
        self.success: bool | None = None
        self.retry_after_ms: float | None = None
        self.pause_ms: float | None = None
        self.tokens: int | None = None
        self.cost: float | None = None

    async def run(self) -> tuple[AttemptRecord, Any]:
        attempt = self.attempt
        place = attempt.place
        # Set while the adapter call is under way: leaving then means the call was aborted.
        calling = False
        try:
            if attempt.ctx.journal is not None:
                await self._mark_dispatch(attempt.ctx.journal)
            call = AdapterCall(
                place.decision.id,
                place.prompt,
                place.target,
                place.decision.output,
                place.number,
                attempt.signal,
            )
            calling = True
            try:
                response = await _invoke(self.adapter, call, attempt.signal)
            except AdapterError as error:
                record, output = self._failed(error), None
            except _SignalFired:
                record, output = self._aborted(), None
            except Exception as error:
                record, output = self._broke(error), None
            else:
                record, output = self._answered(response)
            calling = False
        finally:
            if calling:
                # This task was stopped mid-call (its run was taken away, or the worker stops).
                self.hold_reason = "call-abandoned"
            self._settle()
        return record, output

    async def _mark_dispatch(self, journal: ReceiptJournal) -> None:
        """Make the attempt's slot durable as dispatched before the adapter is called."""
        attempt = self.attempt
        provisional = AttemptRecord(
            **attempt.base,
            sent=True,
            outcome=EXECUTION_UNCERTAIN,
            reason="dispatched",
            evidence=self.evidence,
            started_ms=attempt.started,
        )
        await journal.mark_dispatch(attempt.place.index, provisional)

    def _record(self, **fields: Any) -> AttemptRecord:
        """The record of a sent attempt (``sent`` may say otherwise), ended now."""
        attempt = self.attempt
        return AttemptRecord(
            **attempt.base,
            evidence=self.evidence,
            started_ms=attempt.started,
            ended_ms=attempt.ctx.elapsed_ms(),
            **fields,
        )

    def _failed(self, error: AdapterError) -> AttemptRecord:
        """The adapter reported a failure: what the provider used, and when to try again."""
        self.success = None if error.provider_failure is None else not error.provider_failure
        if error.kind == RATE_LIMITED:
            self.retry_after_ms = error.retry_after_ms
        elif error.retry_after_ms is not None:
            self.pause_ms = error.retry_after_ms
        self.tokens = count_or_none(error.total_tokens)
        if error.kind in _NOT_PROCESSED and self.tokens is None:
            # Refused or never delivered: the provider used nothing, so nothing stays reserved.
            self.tokens, self.cost = 0, 0.0
        outcome = EXECUTION_UNCERTAIN if error.kind == UNCERTAIN else _error_outcome(error)
        return self._record(
            sent=error.sent,
            outcome=outcome,
            reason=error.reason,
            retryable=error.retryable,
            retry_after_ms=error.retry_after_ms,
            tokens=self.tokens,
            cost_usd=self.cost,
        )

    def _aborted(self) -> AttemptRecord:
        """The signal cut the call short; a cancelled call may still run at the provider, so
        its permit is held (a timed-out one has ended there too)."""
        signal = self.attempt.signal
        clock = self.attempt.ctx.clock
        held = None
        cause = "timeout" if is_deadline(signal.reason) else "cancelled"
        if cause == "cancelled" and self._hold_end() > clock.monotonic_ms():
            self.hold_reason = signal.reason or cause
            held = _hold_evidence(self.attempt.ctx, self.hold_reason, self._hold_end())
        return self._record(
            sent=True,
            outcome=EXECUTION_UNCERTAIN,
            reason=cause,
            retryable=True,
            permit_held=held,
        )

    def _broke(self, error: Exception) -> AttemptRecord:
        """The adapter broke after dispatch: nobody knows whether the provider acted."""
        logger.warning(
            "adapter %s raised %s for decision %s",
            self.attempt.place.target.adapter,
            type(error).__name__,
            self.attempt.place.decision.id,
        )
        return self._record(
            sent=True,
            outcome=EXECUTION_UNCERTAIN,
            reason="adapter-exception",
            retryable=True,
        )

    def _answered(self, response: Any) -> tuple[AttemptRecord, Any]:
        """The provider answered: its usage and cost, and the answer parsed (or refused)."""
        decision = self.attempt.place.decision
        target = self.attempt.place.target
        self.success = True
        self.tokens = tokens = count_or_none(response.total_tokens)
        cost = response.cost_usd
        if cost is None and tokens is not None and target.cost_per_token_usd is not None:
            cost = tokens * target.cost_per_token_usd
        self.cost = cost
        output = None
        try:
            output = decision.output.parse(response.answer)
            outcome, reason, retryable = SUCCEEDED, "answered", False
        except InvalidOutputError as error:
            outcome, reason, retryable = INVALID_OUTPUT, str(error), True
        record = self._record(
            sent=True,
            outcome=outcome,
            reason=reason,
            retryable=retryable,
            tokens=tokens,
            cost_usd=float(cost) if valid_amount(cost) else None,
        )
        return record, output

    def _hold_end(self) -> float:
        """Until when an aborted call's permit is held: the attempt's deadline, or sooner when
        the provider documents a cutoff."""
        deadline = self.attempt.deadline
        if self.cutoff_ms is None:
            return deadline
        return min(deadline, self.attempt.ctx.clock.monotonic_ms() + self.cutoff_ms)

    def _settle(self) -> None:
        """Release the lease now, or hold it when the call was aborted after it may have
        reached the provider."""
        if self.hold_reason is None:
            self._release()
            return
        ctx = self.attempt.ctx
        hold_s = (self._hold_end() - ctx.clock.monotonic_ms()) / 1000.0
        if hold_s > 0:
            logger.warning(
                "call to %s for decision %s aborted (%s) after it may have reached the "
                "provider: its permit is held %.1f s more, until the call's timeout",
                self.attempt.place.target.adapter,
                self.attempt.place.decision.id,
                self.hold_reason,
                hold_s,
            )
        hold_release(hold_s, self._release)

    def _release(self) -> None:
        """Release the lease with what the call learned; a provider's pause is shared and the
        span and the shadow call hear of it even when the release fails."""
        attempt = self.attempt
        cost = self.cost if valid_amount(self.cost) else None
        try:
            self.lease.release(
                success=self.success,
                retry_after_ms=self.retry_after_ms,
                actual_tokens=self.tokens,
                actual_cost_usd=cost,
            )
        finally:
            if self.pause_ms is not None:
                attempt.ctx.controller.coordinate_retry_after(
                    attempt.place.target.adapter, self.pause_ms
                )
            if attempt.mirror is not None:
                attempt.mirror.released(
                    self.lease,
                    success=self.success,
                    actual_tokens=self.tokens,
                    actual_cost_usd=cost,
                    retry_after_ms=self.retry_after_ms,
                )
            if attempt.span is not None:
                attempt.span.released(self.lease.evidence)


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
