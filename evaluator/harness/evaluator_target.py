"""The evaluator path: the first ``evaluatorSampleSeconds`` of the timeline through the real
evaluator (``evaluate_decision_ruleset``) with fake adapters, on virtual time.

Every arrival is one evaluation of a one-decision ruleset bound to the arrival's provider, with
``maxRetries`` retries after ``retryBackoffMs``. The fake provider answers after the arrival's
service time and fails the arrival's first dispatched call when the timeline says so. The caller
cancels through the request's ``CancelSignal`` at ``cancelAtMs``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast

from admission.core import (
    REASONS,
    AdmissionRegistry,
    CancelSignal,
    Estimate,
)
from evaluator.engine.adapters.fake import FakeAdapter, FakeStep
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.outcomes import CANCELLED, SUCCEEDED, TIMEOUT, EvaluationResult
from evaluator.engine.rulesets import Decision, Ruleset, Target
from evaluator.engine.scheduler import evaluate_decision_ruleset
from evaluator.harness.arrivals import Arrival
from evaluator.harness.controller_target import estimate_for
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.observed import ObservedAdapter, ObservedRegistry
from evaluator.harness.replay import WORKSPACE_ID, TimelineDriver
from evaluator.harness.target import LoadTarget, Progress, TargetRun

__all__ = ["EVALUATOR_TARGET", "EvaluatorDriver", "run_evaluator_target", "sample_end_ms"]

_PROMPT_PREFIX = "arrival "


def sample_end_ms(manifest: LoadManifest) -> float:
    """``evaluatorSampleSeconds``: the evaluator path's window."""
    return float(manifest.section("duration")["evaluatorSampleSeconds"]) * 1000.0


class EvaluatorDriver(TimelineDriver):
    """Starts one evaluation per arrival and classifies how each one ended."""

    def __init__(
        self,
        manifest: LoadManifest,
        arrivals: Iterable[Arrival],
        end_ms: float,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(manifest, arrivals, end_ms, progress)
        self._observed = cast(AdmissionRegistry, ObservedRegistry(self.registry, self.tally))
        self.adapters = {
            provider_id: ObservedAdapter(FakeAdapter(responder=self._respond), self.tally)
            for provider_id in manifest.section("providers")
        }
        self._in_flight: dict[int, Arrival] = {}
        self._dispatched: set[int] = set()
        self._rulesets: dict[tuple[str, int], Ruleset] = {}
        self._estimates: dict[str, Estimate] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _idle(self) -> bool:
        return not self._in_flight

    def _arrive(self, arrival: Arrival) -> None:
        # Counted before the task runs, so the run cannot look drained in between.
        self.tally.arrive(arrival.principal_class)
        self._in_flight[arrival.ordinal] = arrival
        task = self.loop.create_task(self._evaluate(arrival))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evaluate(self, arrival: Arrival) -> None:
        signal = None
        if arrival.cancel_at_ms is not None:
            delay_ms = arrival.cancel_at_ms - self.loop.clock.monotonic_ms()
            signal = CancelSignal.timeout(delay_ms, reason="cancelled")
        request = DecisionEvaluationRequest(
            ruleset=self._ruleset(arrival.provider_id, arrival.tokens),
            input={"arrival": str(arrival.ordinal)},
            principal_id=arrival.principal_id,
            workspace_id=WORKSPACE_ID,
            invocation_id=f"arrival-{arrival.ordinal}",
            signal=signal,
        )
        try:
            result = await evaluate_decision_ruleset(
                request,
                registry=self._observed,
                adapters=self.adapters,
                estimate=self._estimate,
            )
            self._classify(arrival, result)
        except BaseException as error:
            if self._error is None:
                self._error = error
        finally:
            if signal is not None:
                signal.dispose()
            del self._in_flight[arrival.ordinal]
            self._dispatched.discard(arrival.ordinal)
            self._check_drained()

    def _classify(self, arrival: Arrival, result: EvaluationResult) -> None:
        tally = self.tally
        (outcome,) = result.decisions
        attempts = outcome.attempts
        if any(a.evidence is not None and a.evidence.get("decision") == "admit" for a in attempts):
            tally.admitted_once(arrival.principal_class)
        if result.status in (CANCELLED, TIMEOUT) or outcome.status == CANCELLED:
            assert arrival.cancel_at_ms is not None
            tally.cancel(max(0.0, self.loop.clock.monotonic_ms() - arrival.cancel_at_ms))
        elif outcome.status == SUCCEEDED:
            tally.completed += 1
        elif attempts and not attempts[-1].sent and attempts[-1].reason in REASONS:
            tally.shed_for(attempts[-1].reason)
        else:
            tally.failed += 1

    def _ruleset(self, provider_id: str, tokens: int) -> Ruleset:
        # One ruleset per lane and token size; the arrival itself travels in the input.
        key = (provider_id, tokens)
        ruleset = self._rulesets.get(key)
        if ruleset is None:
            decision_id = f"tokens-{tokens}"
            target = Target.from_dict(
                {
                    "adapter": provider_id,
                    "model": self._model(provider_id),
                    "retry": {
                        "maxAttempts": 1 + self.max_retries,
                        "initialBackoffMs": self.backoff_ms,
                        "maxBackoffMs": self.backoff_ms,
                    },
                },
                "target",
            )
            decision = Decision.from_dict(
                {
                    "id": decision_id,
                    "prompt": _PROMPT_PREFIX + "${arrival}",
                    "allowedOutputs": ["answered"],
                    "binding": {"primary": target.to_dict()},
                },
                "decision",
            )
            ruleset = Ruleset(id=f"load-{provider_id}-{tokens}", decisions=(decision,))
            self._rulesets[key] = ruleset
            self._estimates[decision_id] = estimate_for(tokens)
        return ruleset

    def _model(self, provider_id: str) -> str:
        """The model name a target of ``provider_id`` asks for."""
        return "fake"

    def _estimate(self, decision: Decision, target: Target, prompt: str) -> Estimate:
        return self._estimates[decision.id]

    def _arrival_of(self, call: Any) -> Arrival:
        return self._in_flight[int(call.prompt[len(_PROMPT_PREFIX) :])]

    def _respond(self, call: Any) -> FakeStep:
        arrival = self._arrival_of(call)
        first_dispatch = arrival.ordinal not in self._dispatched
        self._dispatched.add(arrival.ordinal)
        if first_dispatch and arrival.fails_first_attempt:
            return FakeStep(latency_ms=arrival.service_ms, error="server-error")
        return FakeStep(latency_ms=arrival.service_ms)


def run_evaluator_target(
    manifest: LoadManifest, arrivals: Iterable[Arrival], progress: Progress | None = None
) -> TargetRun:
    """Release ``arrivals`` into the evaluator over the ``evaluatorSampleSeconds`` window."""
    return EvaluatorDriver(manifest, arrivals, sample_end_ms(manifest), progress).run()


EVALUATOR_TARGET = LoadTarget(
    name="evaluator", window_end_ms=sample_end_ms, run=run_evaluator_target
)
