"""``evaluate_decision_ruleset``: run the decisions of a ruleset under admission control.

Serial unless ``scheduler.enabled``; when enabled, at most the smallest declared ceiling of
binding, caller, graph, principal, workspace and providers run at once, in fair lanes keyed
(first target adapter, workspace, principal). Results are always in the ruleset's order.
Pure Python: no Django import, so the load harness can run it on virtual time.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from typing import Any

from admission.core import (
    AdmissionController,
    AdmissionRegistry,
    CancelSignal,
    Profile,
    ProfileConflictError,
)
from evaluator.engine.adapters.base import Adapter
from evaluator.engine.attempts import (
    TOTAL_DEADLINE,
    AttemptContext,
    AttemptPlace,
    is_deadline,
    run_attempt,
)
from evaluator.engine.deferrals import DeferralLog
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.estimates import EstimateFn, default_estimate
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.lanes import FairPermits
from evaluator.engine.outcomes import (
    CANCELLED,
    ESTIMATE_FAILED,
    EXECUTION_UNCERTAIN,
    SUCCEEDED,
    TIMEOUT,
    AttemptRecord,
    DecisionOutcome,
    EvaluationResult,
)
from evaluator.engine.receipts import RUNNING, ReceiptJournal, ReceiptKey, ReceiptStore
from evaluator.engine.rulesets import DEFAULT_MAX_PROMPT_CHARS, Decision, prompt_values
from evaluator.engine.telemetry import EvaluatorTelemetry

__all__ = ["evaluate_decision_ruleset", "next_step", "scheduler_ceiling"]

# What happens after an attempt.
DONE = "done"
RETRY = "retry"
NEXT_TARGET = "next-target"
STOP = "stop"
# The reason of the unsent attempt a decision records when its prompt would exceed the cap.
PROMPT_TOO_LARGE = "prompt-too-large"
# Prompts up to this many characters (template plus rendering) are written on the loop itself.
INLINE_RENDER_CHARS = 65_536


def scheduler_ceiling(request: DecisionEvaluationRequest, profile: Profile) -> int:
    """How many decisions may hold a scheduler permit at once.

    1 when the scheduler is disabled; otherwise the smallest positive ceiling of binding, caller,
    graph, the principal's, the workspace's and every provider's limits that the ruleset
    targets. Receipt-backed runs are no exception: receipt v3 holds a slot per call in flight.
    """
    if not request.scheduler.enabled:
        return 1
    ceilings = [
        request.scheduler.binding_concurrency,
        request.caller_concurrency,
        request.graph_concurrency,
        profile.workspace.concurrency,
    ]
    principal = profile.principal(request.principal_id)
    if principal is not None:
        ceilings.append(principal.concurrency)
    for adapter_id in sorted(request.ruleset.adapter_ids()):
        provider = profile.provider(adapter_id)
        if provider is not None:
            ceilings.append(provider.concurrency)
    return min(value for value in ceilings if value is not None and value > 0)


def next_step(record: AttemptRecord, *, idempotent: bool, stopped: bool) -> str:
    """What follows an attempt: ``done``, ``retry`` the target, the ``next-target`` or ``stop``.

    Refusals before dispatch are retried only when admission called them retryable; an attempt
    of unknown outcome is asked again only of an idempotent adapter.
    """
    if record.outcome == SUCCEEDED:
        return DONE
    if stopped:
        return STOP
    if record.outcome == EXECUTION_UNCERTAIN:
        return RETRY if idempotent else STOP
    return RETRY if record.retryable else NEXT_TARGET


async def evaluate_decision_ruleset(
    request: DecisionEvaluationRequest,
    *,
    registry: AdmissionRegistry,
    adapters: Mapping[str, Adapter],
    receipt_store: ReceiptStore | None = None,
    telemetry: EvaluatorTelemetry | None = None,
    estimate: EstimateFn | None = None,
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    deferrals: DeferralLog | None = None,
) -> EvaluationResult:
    """Evaluate every decision of ``request.ruleset`` and return the outcomes in ruleset order.

    The engine's entry point: past the request, its parameters are keyword-only, each an
    independent part of the deployment (admission, adapters) or an option with a default.

    Runs on the running event loop, whose clock must be the registry's (a ``VirtualTimeLoop``
    with ``AdmissionRegistry(clock=loop.clock)`` in tests and the harness). ``adapters`` maps
    every adapter id the ruleset names to an adapter; the adapter id is also the admission
    provider id. With ``receipt_store`` the run is durable and resumable under the request's
    ``invocation_id``, at the same ceiling. ``estimate(decision, target, prompt)`` overrides the
    default admission estimate. A decision whose rendered prompt would exceed
    ``max_prompt_chars`` is never rendered: each of its targets records an unsent
    ``estimate-failed`` attempt with the reason ``prompt-too-large``. Raises
    ``InvalidDefinitionError`` before any call when the request cannot run (unknown adapter,
    no or conflicting profile, receipt of another ruleset). With ``deferrals`` (the worker's
    ``deferral_log()``) each attempt's record names the reasons admission deferred it for
    (``deferredBy``); hosts that do not read them (the load harness) skip the listening.
    """
    if not isinstance(request, DecisionEvaluationRequest):
        raise InvalidDefinitionError("request", "must be a DecisionEvaluationRequest")
    _check_adapters(request, adapters)
    controller = _controller_for(request, registry)
    ceiling = scheduler_ceiling(request, controller.profile)
    journal = None
    if receipt_store is not None:
        journal = await ReceiptJournal.open(
            receipt_store,
            ReceiptKey(request.workspace_id, request.principal_id, request.invocation_id),
            ruleset_id=request.ruleset.id,
            ruleset_digest=request.ruleset.digest,
            decision_ids=[decision.id for decision in request.ruleset.decisions],
            clock=registry.clock,
        )
        if journal.state != RUNNING:
            return _from_receipt(request, journal, ceiling)
    if telemetry is not None:
        telemetry.watch(registry)
    run = _Run(
        request,
        controller,
        registry,
        adapters,
        ceiling,
        journal,
        telemetry,
        estimate,
        max_prompt_chars=max_prompt_chars,
        deferrals=deferrals,
    )
    try:
        return await run.execute()
    finally:
        run.dispose()


def _check_adapters(request: DecisionEvaluationRequest, adapters: Mapping[str, Adapter]) -> None:
    field = request.ruleset.unknown_adapter_field(adapters)
    if field is not None:
        raise InvalidDefinitionError(field, "names no configured adapter")


def _controller_for(
    request: DecisionEvaluationRequest, registry: AdmissionRegistry
) -> AdmissionController:
    options = request.scheduler
    if options.profile is not None:
        try:
            controller = registry.register(options.profile)
        except ProfileConflictError as conflict:
            raise InvalidDefinitionError(
                "scheduler.profile.profileVersion",
                f"revision {conflict.profile_version!r} is already registered with other limits",
            ) from None
    else:
        found = registry.controller(request.workspace_id)
        if found is None:
            raise InvalidDefinitionError(
                "scheduler.profile", "no admission profile is registered for this workspace"
            )
        controller = found
    version = options.profile_version
    if version is not None and controller.profile.profile_version != version:
        raise InvalidDefinitionError(
            "scheduler.profileVersion", "is not the workspace's current profile revision"
        )
    return controller


def _from_receipt(
    request: DecisionEvaluationRequest, journal: ReceiptJournal, ceiling: int
) -> EvaluationResult:
    decisions = []
    for index, decision in enumerate(request.ruleset.decisions):
        outcome = journal.outcome(index)
        if outcome is None:
            outcome = DecisionOutcome(
                decision.id, journal.state, attempts=tuple(journal.attempts(index))
            )
        decisions.append(outcome)
    return EvaluationResult(
        invocation_id=request.invocation_id,
        ruleset_id=request.ruleset.id,
        status=journal.state,
        decisions=tuple(decisions),
        concurrency=ceiling,
        resumed=True,
    )


class _Run:
    """The state of one evaluation while it runs."""

    def __init__(
        self,
        request: DecisionEvaluationRequest,
        controller: AdmissionController,
        registry: AdmissionRegistry,
        adapters: Mapping[str, Adapter],
        ceiling: int,
        journal: ReceiptJournal | None,
        telemetry: EvaluatorTelemetry | None,
        estimate: EstimateFn | None,
        *,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        deferrals: DeferralLog | None = None,
    ) -> None:
        """Its parameters are `evaluate_decision_ruleset`'s, resolved there (the controller,
        the ceiling, the opened journal), its only caller: one each, nothing to group."""
        self.request = request
        self.ruleset = request.ruleset
        self.prompt_values = prompt_values(request.input)
        self.max_prompt_chars = max_prompt_chars
        self.adapters = adapters
        self.journal = journal
        self.loop = asyncio.get_running_loop()
        clock = registry.clock
        origin = clock.monotonic_ms()
        self.deadline_signal: CancelSignal | None = None
        deadline_ms = None
        if request.deadline_ms is not None:
            deadline_ms = origin + request.deadline_ms
            self.deadline_signal = CancelSignal.timeout(request.deadline_ms, TOTAL_DEADLINE)
        self.signal = CancelSignal.any(request.signal, self.deadline_signal)
        # A budget id of its own per run: two runs never share invocation budgets.
        budget_id = f"{request.invocation_id}/{secrets.token_hex(6)}"
        # A shadow started after the run began sees the runs that begin after it.
        shadow = registry.shadow(request.workspace_id)
        if deferrals is not None:
            deferrals.listen(registry)
        self.ctx = AttemptContext(
            controller=controller,
            adapters=adapters,
            budget_id=budget_id,
            principal_id=request.principal_id,
            workspace_id=request.workspace_id,
            run_signal=self.signal,
            deadline_ms=deadline_ms,
            clock=clock,
            origin_ms=origin,
            estimate=estimate or default_estimate,
            telemetry=telemetry,
            journal=journal,
            shadow=shadow,
            deferrals=deferrals,
        )
        self.ceiling = ceiling
        # Serial runs keep their single permit through a backoff.
        self.keep_permit = not request.scheduler.enabled
        self.permits: FairPermits[int] = FairPermits(ceiling, self._start)
        self.outcomes: list[DecisionOutcome | None] = [None] * len(self.ruleset.decisions)
        self.stopped_unstarted: list[int] = []
        self.stopped = False
        # Attempts admitted in this run per provider, for the attempt-budget check before a wait.
        self.admitted: dict[str, int] = {}
        self.remaining = 0
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.tasks: set[asyncio.Task[None]] = set()

    def dispose(self) -> None:
        self.ctx.controller.release_budget(self.ctx.budget_id)
        if self.ctx.shadow is not None:
            self.ctx.shadow.release_budget(self.ctx.budget_id)
        self.signal.dispose()
        if self.deadline_signal is not None:
            self.deadline_signal.dispose()

    def stop_status(self) -> str:
        return TIMEOUT if is_deadline(self.signal.reason) else CANCELLED

    async def execute(self) -> EvaluationResult:
        journal = self.journal
        resumed = journal is not None and journal.resumed
        if journal is not None:
            await journal.resolve_pending()
            for index in range(len(self.outcomes)):
                self.outcomes[index] = journal.outcome(index)
        pending = [index for index, outcome in enumerate(self.outcomes) if outcome is None]
        self.remaining = len(pending)
        if pending:
            unsubscribe = self.signal.add_callback(self._on_stop)
            try:
                for index in pending:
                    self.permits.enqueue(self._lane(index), index)
                self.permits.pump()
                await self._wait()
            finally:
                unsubscribe()
        status = self.stop_status() if self.stopped else "completed"
        if journal is not None:
            unstarted = [(index, self.outcomes[index]) for index in self.stopped_unstarted]
            await journal.finish(status, [(i, o) for i, o in unstarted if o is not None])
        decisions = tuple(outcome for outcome in self.outcomes if outcome is not None)
        return EvaluationResult(
            invocation_id=self.request.invocation_id,
            ruleset_id=self.ruleset.id,
            status=status,
            decisions=decisions,
            concurrency=self.ceiling,
            max_active=self.permits.max_active,
            resumed=resumed,
        )

    async def _wait(self) -> None:
        if self.remaining == 0:
            return
        try:
            await self.done
        except BaseException:
            # A failing decision (or our own cancellation) takes the rest of the run down with it.
            self.permits.drain()
            for task in list(self.tasks):
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
            if self.journal is not None:
                # Leave no receipt write running behind the run.
                await self.journal.settle()
            raise

    def _lane(self, index: int) -> tuple[str, str, str]:
        first = self.ruleset.decisions[index].binding.primary.adapter
        return (first, self.request.workspace_id, self.request.principal_id)

    def _start(self, index: int) -> None:
        task = self.loop.create_task(self._decision_task(index))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _on_stop(self, _signal: CancelSignal) -> None:
        if self.remaining == 0:
            return
        self.stopped = True
        status = self.stop_status()
        for index in self.permits.drain():
            attempts = tuple(self.journal.attempts(index)) if self.journal is not None else ()
            self.outcomes[index] = DecisionOutcome(
                self.ruleset.decisions[index].id, status, attempts=attempts
            )
            self.stopped_unstarted.append(index)
            self._finished()
        self.permits.abort_resumers()

    def _finished(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and not self.done.done():
            self.done.set_result(None)

    async def _decision_task(self, index: int | None) -> None:
        # One task runs decisions back to back while the permit it holds passes to unstarted
        # work, so a decision costs no task creation and no event-loop round trip.
        permit = [True]
        try:
            while index is not None:
                outcome = await self._run_decision(index, permit)
                self.outcomes[index] = outcome
                self._finished()
                index = None
                if permit[0] and not self.done.done():
                    keep, index = self.permits.hand_over()
                    permit[0] = keep
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            if not self.done.done():
                self.done.set_exception(error)
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
        finally:
            if permit[0]:
                permit[0] = False
                self.permits.release()

    async def _run_decision(self, index: int, permit: list[bool]) -> DecisionOutcome:
        decision = self.ruleset.decisions[index]
        prompt = await self._render(decision)
        attempts: list[AttemptRecord] = (
            self.journal.attempts(index) if self.journal is not None else []
        )
        targets = decision.binding.targets
        target_index, number = self._resume_position(decision, attempts)
        while target_index < len(targets):
            target = targets[target_index]
            idempotent = bool(getattr(self.adapters[target.adapter], "idempotent", False))
            while number <= target.retry.max_attempts:
                if self.signal.cancelled:
                    return self._stopped(decision.id, attempts)
                if prompt is None:
                    record, output = self._prompt_refused(target_index, target, number), None
                else:
                    place = AttemptPlace(index, decision, prompt, target_index, target, number)
                    record, output = await run_attempt(self.ctx, place)
                attempts.append(record)
                if record.evidence is not None and record.evidence.get("decision") == "admit":
                    self.admitted[target.adapter] = self.admitted.get(target.adapter, 0) + 1
                step = next_step(record, idempotent=idempotent, stopped=self.signal.cancelled)
                last_target = target_index == len(targets) - 1
                exhausted = number == target.retry.max_attempts
                terminal = step in (DONE, STOP) or (
                    last_target and (step == NEXT_TARGET or exhausted)
                )
                outcome = None
                if terminal:
                    status = SUCCEEDED if step == DONE else record.outcome
                    outcome = DecisionOutcome(decision.id, status, output, tuple(attempts))
                if self.journal is not None:
                    await self.journal.record_attempt(index, record, outcome=outcome)
                if outcome is not None:
                    return outcome
                if step == NEXT_TARGET or exhausted:
                    break
                wait_ms = max(target.retry.backoff_ms(number), record.retry_after_ms or 0.0)
                if not self._attempt_budget_left(target.adapter):
                    # Waiting cannot help: the next attempt is refused (and recorded) at once.
                    wait_ms = 0.0
                if not await self._backoff(wait_ms, permit):
                    return await self._stopped_recorded(index, decision.id, attempts)
                number += 1
            target_index += 1
            number = 1
        # Resumed past the last target without a terminal record (defensive).
        status = attempts[-1].outcome if attempts else self.stop_status()
        return DecisionOutcome(decision.id, status, None, tuple(attempts))

    async def _render(self, decision: Decision) -> str | None:
        """The decision's prompt, or None when it would exceed the run's prompt cap."""
        length = decision.rendered_length(self.prompt_values)
        if length > self.max_prompt_chars:
            return None
        if length + len(decision.prompt) <= INLINE_RENDER_CHARS:
            return decision.render(self.prompt_values)
        # A long prompt is written on a thread: the loop keeps serving other runs meanwhile.
        return await asyncio.to_thread(decision.render, self.prompt_values)

    def _prompt_refused(self, target_index: int, target: Any, number: int) -> AttemptRecord:
        now = self.ctx.elapsed_ms()
        return AttemptRecord(
            target_index=target_index,
            adapter_id=target.adapter,
            model=target.model,
            number=number,
            sent=False,
            outcome=ESTIMATE_FAILED,
            reason=PROMPT_TOO_LARGE,
            started_ms=now,
            ended_ms=now,
        )

    def _attempt_budget_left(self, provider_id: str) -> bool:
        """Whether the invocation's attempt budgets (principal, workspace, provider) still allow
        one more admitted attempt on ``provider_id``."""
        profile = self.ctx.controller.profile
        total = sum(self.admitted.values())
        principal = profile.principal(self.request.principal_id)
        provider = profile.provider(provider_id)
        for limits, used in (
            (principal, total),
            (profile.workspace, total),
            (provider, self.admitted.get(provider_id, 0)),
        ):
            bound = limits.max_attempts if limits is not None else None
            if bound is not None and used + 1 > bound:
                return False
        return True

    def _resume_position(self, decision: Any, attempts: list[AttemptRecord]) -> tuple[int, int]:
        if not attempts:
            return 0, 1
        last = attempts[-1]
        target = decision.binding.targets[last.target_index]
        idempotent = bool(getattr(self.adapters[target.adapter], "idempotent", False))
        step = next_step(last, idempotent=idempotent, stopped=False)
        if step == RETRY and last.number < target.retry.max_attempts:
            return last.target_index, last.number + 1
        return last.target_index + 1, 1

    def _stopped(self, decision_id: str, attempts: list[AttemptRecord]) -> DecisionOutcome:
        return DecisionOutcome(decision_id, self.stop_status(), None, tuple(attempts))

    async def _stopped_recorded(
        self, index: int, decision_id: str, attempts: list[AttemptRecord]
    ) -> DecisionOutcome:
        outcome = self._stopped(decision_id, attempts)
        if self.journal is not None:
            await self.journal.finish_decision(index, outcome)
        return outcome

    async def _backoff(self, wait_ms: float, permit: list[bool]) -> bool:
        """Sleep before a retry; False when the run was stopped meanwhile.

        A scheduled run lends its permit out while it sleeps and takes one back ahead of
        unstarted work; a serial run keeps its one permit.
        """
        if self.signal.cancelled:
            return False
        lend = not self.keep_permit
        if lend:
            permit[0] = False
            self.permits.release()
        if await self._sleep(wait_ms):
            return False
        if lend:
            if not await self._resume():
                return False
            permit[0] = True
        return not self.signal.cancelled

    async def _sleep(self, wait_ms: float) -> bool:
        """Wait ``wait_ms`` unless the run signal fires first; True when it fired."""
        if self.signal.cancelled:
            return True
        if wait_ms <= 0:
            return False
        wake: asyncio.Future[bool] = self.loop.create_future()
        timer = self.loop.call_later(wait_ms / 1000.0, _settle, wake, False)
        unsubscribe = self.signal.add_callback(lambda _signal: _settle(wake, True))
        try:
            return await wake
        finally:
            timer.cancel()
            unsubscribe()

    async def _resume(self) -> bool:
        """Take a permit back ahead of unstarted work; False when the run stopped first."""
        waiter = self.permits.resume()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.permits.release()
            else:
                waiter.cancel()
            raise


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
