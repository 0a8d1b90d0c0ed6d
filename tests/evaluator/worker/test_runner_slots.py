"""A worker's run frees its runner slot while it waits for admission: a run counts as waiting
while some of its attempts wait and none holds a permit, so a parallel run with many attempts
waiting counts once, and one with calls in flight keeps its slot."""

from __future__ import annotations

import pytest

from admission.core import AdmissionRequest, Estimate
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.scheduler import evaluate_decision_ruleset
from evaluator.worker.runner import SlotFreeingRegistry
from tests.evaluator.builders import (
    PRINCIPAL,
    WORKSPACE,
    profile,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)

OTHER = "principal-other"


class CountingRunner:
    """Stands in for the runner: keeps the count of waiting runs it is told about."""

    def __init__(self) -> None:
        self.waiting = 0
        self.seen: list[int] = []

    def admission_wait(self, change: int) -> None:
        self.waiting += change
        self.seen.append(self.waiting)


@pytest.mark.parametrize("taken", [0, 4, 7, 8])
def test_a_parallel_run_counts_as_one_waiting_run_at_most(taken):
    """Another principal holds `taken` of the provider's 8 permits at first, so up to `taken`
    of the run's 8 attempts wait at once (all of them when it holds all 8)."""

    async def main(loop):
        prof = profile(
            providers={"fake": {"concurrency": 8}},
            principals={PRINCIPAL: {"concurrency": 8}, OTHER: {"concurrency": 8}},
        )
        shared = registry_with(loop, prof)
        runner = CountingRunner()
        registry = SlotFreeingRegistry(runner, shared)
        leases = [
            await shared.controller(WORKSPACE).acquire(
                AdmissionRequest(f"other-{i}", OTHER, WORKSPACE, "fake", Estimate())
            )
            for i in range(taken)
        ]
        for lease in leases:
            loop.call_later(0.05, lease.release, True)
        fake = FakeAdapter(default=FakeStep(latency_ms=20))
        result = await evaluate_decision_ruleset(
            request(ruleset_doc(8), scheduler={"enabled": True, "bindingConcurrency": 8}),
            registry=registry,
            adapters={"fake": fake},
        )
        return result, runner, fake

    result, runner, fake = run_virtual(main)
    assert result.status == "completed" and len(fake.calls) == 8
    assert runner.waiting == 0
    # However many of its attempts wait, the run counts once; never below zero.
    assert all(0 <= count <= 1 for count in runner.seen)
    if taken == 8:
        assert 1 in runner.seen
