"""The v1 manifest's unit gate (CNC-SCHED-005): its declared durations expanded into synthetic
arrivals and run through the bounded scheduler of the real evaluator.

It is also v1's load run (``python -m evaluator.harness --manifest
manifests/load-manifest.v1.json --target evaluator``): the report becomes a
``decision-load-result/v1`` record judged against v1's bounds.

The v1 manifest declares the six concurrency ceilings of a scheduled evaluation, a seeded
bursty arrival rate and three bounds the gate judges: active calls, canonical output order and
eligible-lane wait. It declares no lanes, principals or service times, so the gate fixes them
here: one principal, two provider lanes, 10 to 40 ms of fake service (spike load 80/s x 25 ms
over 3 permits stays below saturation, so a long wait would mean unfairness, not overload).
Arrivals are grouped by virtual second into one evaluation each, started at the second's first
arrival, decisions in arrival order. v1's request, token and budget ceilings are admission
limits, which the v2 manifest qualifies; the gate's admission profile carries only v1's
concurrency and queue ceilings, because the gate qualifies the scheduler alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from admission.core import AdmissionRegistry, Profile, VirtualTimeLoop
from evaluator.engine.adapters.fake import FakeAdapter, FakeStep
from evaluator.engine.invocation import DecisionEvaluationRequest, SchedulerOptions
from evaluator.engine.outcomes import EvaluationResult
from evaluator.engine.outputs import OutputSpec
from evaluator.engine.rulesets import Binding, Decision, Ruleset, Target
from evaluator.engine.scheduler import evaluate_decision_ruleset, scheduler_ceiling
from evaluator.harness.arrivals import Arrival, ArrivalModel, PrincipalWeight, generate_arrivals
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.observed import ObservedAdapter, ObservedRegistry
from evaluator.harness.records import MODE_OFFLINE
from evaluator.harness.tally import LoadTally
from evaluator.harness.target import LoadTarget, Progress, TargetRun, window

__all__ = [
    "GATE_LANES",
    "SCHEDULER_GATE_TARGET",
    "SchedulerGateReport",
    "gate_arrivals",
    "run_scheduler_gate",
]

WORKSPACE_ID = "scheduler-gate"
PRINCIPAL_ID = "gate"
GATE_LANES = ("lane-a", "lane-b")
SERVICE_MS = (10, 40)
_PROMPT_PREFIX = "arrival "
_ALLOWED = OutputSpec(allowed_outputs=("answered",))


@dataclass(frozen=True, slots=True)
class SchedulerGateReport:
    """What the gate observed; ``passed`` judges the v1 bounds it covers."""

    arrivals: int
    evaluations: int
    ceiling: int
    maximum_active_calls: int
    maximum_scheduler_active: int
    canonical_order_kept: bool
    reordered_evaluations: int
    maximum_eligible_lane_wait_ms: float
    succeeded: int
    bounds: dict[str, Any]

    @property
    def passed(self) -> bool:
        return (
            self.ceiling <= self.bounds["maximumActiveCalls"]
            and self.maximum_active_calls <= self.bounds["maximumActiveCalls"]
            and self.maximum_scheduler_active <= self.ceiling
            and self.canonical_order_kept
            and self.maximum_eligible_lane_wait_ms <= self.bounds["maximumEligibleLaneWaitMs"]
            and self.succeeded == self.arrivals
        )


def _v1_profile(manifest: LoadManifest) -> Profile:
    declared = manifest.section("profile")
    queue = {
        "maxQueueLength": declared["maxQueueLength"],
        "maxQueueWaitMs": declared["maxQueueWaitMs"],
    }
    return Profile.from_dict(
        {
            "profileVersion": f"scheduler-gate-v{manifest.version}",
            "workspace": {"concurrency": declared["workspaceConcurrency"], **queue},
            "providers": {
                lane: {"concurrency": declared["providerConcurrency"]} for lane in GATE_LANES
            },
            "principals": {PRINCIPAL_ID: {"concurrency": declared["principalConcurrency"]}},
        },
        workspace_id=WORKSPACE_ID,
    )


def gate_end_ms(manifest: LoadManifest) -> float:
    """load + spike + soak: the gate's window."""
    duration = manifest.section("duration")
    seconds = duration["loadSeconds"] + duration["spikeSeconds"] + duration["soakSeconds"]
    return float(seconds) * 1000.0


def gate_arrivals(manifest: LoadManifest, end_ms: float | None = None) -> list[Arrival]:
    """v1's seeded arrivals over load + spike + soak, with the gate's lanes and service times."""
    model = manifest.section("arrivalModel")
    duration = manifest.section("duration")
    load_ms = float(duration["loadSeconds"]) * 1000.0
    if end_ms is None:
        end_ms = gate_end_ms(manifest)
    arrival_model = ArrivalModel(
        seed=int(model["seed"]),
        average_requests_per_second=float(model["averageRequestsPerSecond"]),
        spike_multiplier=float(model["spikeMultiplier"]),
        spike_start_ms=load_ms,
        spike_end_ms=load_ms + float(model["spikeDurationSeconds"]) * 1000.0,
        principals=(PrincipalWeight(PRINCIPAL_ID, "quiet", 1.0),),
        provider_ids=GATE_LANES,
        small_tokens=1,
        huge_tokens=1,
        huge_token_share=0.0,
        service_minimum_ms=SERVICE_MS[0],
        service_maximum_ms=SERVICE_MS[1],
        retryable_failure_rate=0.0,
        cancellation_rate=0.0,
        cancel_after_ms=0,
    )
    return generate_arrivals(arrival_model, end_ms)


class _Gate:
    def __init__(self, manifest: LoadManifest, arrivals: Sequence[Arrival]) -> None:
        declared = manifest.section("profile")
        self.declared = declared
        self.arrivals = arrivals
        self.by_ordinal = {arrival.ordinal: arrival for arrival in arrivals}
        self.loop = VirtualTimeLoop()
        self.tally = LoadTally()
        registry = AdmissionRegistry(clock=self.loop.clock, rng=random.Random(0))
        self.profile = _v1_profile(manifest)
        registry.register(self.profile)
        self.registry = cast(AdmissionRegistry, ObservedRegistry(registry, self.tally))
        self.adapters = {
            lane: ObservedAdapter(FakeAdapter(responder=self._respond), self.tally)
            for lane in GATE_LANES
        }
        self.targets = {lane: Target(adapter=lane, model="fake") for lane in GATE_LANES}
        self.results: list[tuple[Ruleset, EvaluationResult]] = []

    def request(self, batch: Sequence[Arrival]) -> DecisionEvaluationRequest:
        decisions = tuple(
            Decision(
                id=f"a{arrival.ordinal}",
                prompt=f"{_PROMPT_PREFIX}{arrival.ordinal}",
                output=_ALLOWED,
                binding=Binding(primary=self.targets[arrival.provider_id]),
            )
            for arrival in batch
        )
        return DecisionEvaluationRequest(
            ruleset=Ruleset(id=f"second-{batch[0].at_ms // 1000}", decisions=decisions),
            input={},
            principal_id=PRINCIPAL_ID,
            workspace_id=WORKSPACE_ID,
            scheduler=SchedulerOptions(
                enabled=True, binding_concurrency=self.declared["bindingConcurrency"]
            ),
            caller_concurrency=self.declared["callerConcurrency"],
            graph_concurrency=self.declared["graphConcurrency"],
            invocation_id=f"second-{batch[0].at_ms // 1000}",
        )

    def _respond(self, call: Any) -> FakeStep:
        arrival = self.by_ordinal[int(call.prompt[len(_PROMPT_PREFIX) :])]
        return FakeStep(latency_ms=arrival.service_ms)

    async def _evaluate(self, batch: Sequence[Arrival]) -> None:
        request = self.request(batch)
        result = await evaluate_decision_ruleset(
            request, registry=self.registry, adapters=self.adapters
        )
        self.results.append((request.ruleset, result))

    async def run(self) -> None:
        batches: dict[int, list[Arrival]] = {}
        for arrival in self.arrivals:
            batches.setdefault(arrival.at_ms // 1000, []).append(arrival)
        tasks = []
        for batch in batches.values():
            await _sleep_until(self.loop, batch[0].at_ms)
            tasks.append(self.loop.create_task(self._evaluate(batch)))
        await asyncio.gather(*tasks)


async def _sleep_until(loop: asyncio.AbstractEventLoop, at_ms: int) -> None:
    delay = at_ms / 1000.0 - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _first_dispatch_wait_ms(outcome: Any) -> float:
    # From the evaluation's start to the dispatch: scheduler permit wait plus admission queueing.
    first = outcome.attempts[0]
    queue_delay = first.evidence.get("queueDelayMs", 0.0) if first.evidence else 0.0
    return float(first.started_ms + queue_delay)


def run_scheduler_gate(
    manifest: LoadManifest, arrivals: Sequence[Arrival] | None = None
) -> SchedulerGateReport:
    """Run the v1 gate and report what it observed against the manifest's bounds."""
    report, _tally = _run_gate(manifest, gate_arrivals(manifest) if arrivals is None else arrivals)
    return report


def _run_gate(
    manifest: LoadManifest, arrivals: Sequence[Arrival]
) -> tuple[SchedulerGateReport, LoadTally]:
    gate = _Gate(manifest, arrivals)
    probe = gate.request(arrivals[:1])
    ceiling = scheduler_ceiling(probe, gate.profile)
    try:
        gate.loop.run_until_complete(gate.run())
    finally:
        gate.loop.close()
    canonical = True
    reordered = 0
    longest_wait = 0.0
    succeeded = 0
    scheduler_active = 0
    for ruleset, result in gate.results:
        order = [decision.id for decision in ruleset.decisions]
        canonical &= [outcome.decision_id for outcome in result.decisions] == order
        finished = sorted(result.decisions, key=lambda outcome: outcome.attempts[-1].ended_ms)
        reordered += [outcome.decision_id for outcome in finished] != order
        scheduler_active = max(scheduler_active, result.max_active)
        for outcome in result.decisions:
            succeeded += outcome.succeeded
            longest_wait = max(longest_wait, _first_dispatch_wait_ms(outcome))
    report = SchedulerGateReport(
        arrivals=len(arrivals),
        evaluations=len(gate.results),
        ceiling=ceiling,
        maximum_active_calls=gate.tally.max_active,
        maximum_scheduler_active=scheduler_active,
        canonical_order_kept=canonical,
        reordered_evaluations=reordered,
        maximum_eligible_lane_wait_ms=longest_wait,
        succeeded=succeeded,
        bounds=dict(manifest.bounds),
    )
    return report, gate.tally


def _run_gate_target(
    manifest: LoadManifest, arrivals: Iterable[Arrival], progress: Progress | None = None
) -> TargetRun:
    arrivals = list(arrivals)
    report, tally = _run_gate(manifest, arrivals)
    end_ms = gate_end_ms(manifest)
    observations = tally.observations(end_ms)
    # Every arrival is one decision of the second's evaluation; none is retried or cancelled.
    observations.update(
        arrivals=report.arrivals,
        completed=report.succeeded,
        failed=report.arrivals - report.succeeded,
        maximumEligibleLaneWaitMs=report.maximum_eligible_lane_wait_ms,
        retryAmplificationRatio=tally.attempts / report.arrivals if report.arrivals else None,
        quietPrincipalAdmissionRatio=report.succeeded / report.arrivals
        if report.arrivals
        else None,
        evaluations=report.evaluations,
        schedulerCeiling=report.ceiling,
        canonicalOrderKept=report.canonical_order_kept,
    )
    if progress is not None:
        progress(1.0)
    return TargetRun(
        mode=MODE_OFFLINE,
        window=window(end_ms),
        observations=observations,
        virtual_duration_ms=end_ms,
    )


# v1's load run: the gate through the real evaluator, recorded as the evaluator target.
SCHEDULER_GATE_TARGET = LoadTarget(
    name="evaluator",
    window_end_ms=gate_end_ms,
    run=_run_gate_target,
    make_arrivals=gate_arrivals,
)
