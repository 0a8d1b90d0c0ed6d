"""An aborted call keeps its admission permit until the provider is done with it (virtual time).

Two evaluations share a provider that admits one call at a time. Run A's call is cancelled
100 ms in; run B, queued behind it, is admitted only when A's call would have timed out (1 s),
or sooner when the adapter documents a shorter provider-side cut-off.
"""

from __future__ import annotations

import asyncio

import pytest

from admission.core import CancelSignal
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.holds import holds_pending
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import profile, registry_with, request, ruleset_doc, run_virtual


class RemoteFake(FakeAdapter):
    """A fake whose provider may go on working on a call its caller aborted."""

    def __init__(self, cutoff_ms: float | None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.abort_cutoff_ms = cutoff_ms  # type: ignore[misc]


@pytest.mark.parametrize(
    ("cutoff_ms", "admitted_at_ms"),
    [(None, 1000.0), (200.0, 300.0), (0.0, 100.0)],
    ids=["until-its-timeout", "a-documented-cut-off", "a-provider-that-stops-at-once"],
)
def test_CNC_SCHED_HOLD_001_a_cancelled_call_holds_its_permit(cutoff_ms, admitted_at_ms):
    async def main(loop):
        one_at_a_time = profile(providers={"fake": {"concurrency": 1}})
        registry = registry_with(loop, one_at_a_time)
        adapter = RemoteFake(cutoff_ms, default=FakeStep(latency_ms=800))
        caller = CancelSignal()
        loop.call_later(0.1, caller.cancel, "caller-gave-up")
        first = request(ruleset_doc(1, timeoutMs=1000), signal=caller)
        second = request(ruleset_doc(1, timeoutMs=5000))
        a = loop.create_task(
            evaluate_decision_ruleset(first, registry=registry, adapters={"fake": adapter})
        )
        await asyncio.sleep(0.05)
        b = loop.create_task(
            evaluate_decision_ruleset(second, registry=registry, adapters={"fake": adapter})
        )
        cancelled = await a
        # A's run ends at once; only its permit waits.
        assert loop.time() == pytest.approx(0.1)
        held = holds_pending(loop)
        answered = await b
        return cancelled, answered, held, holds_pending(loop)

    cancelled, answered, held_after_cancel, held_at_end = run_virtual(main)
    attempt = cancelled.decisions[0].attempts[0]
    assert (attempt.outcome, attempt.reason) == ("execution-uncertain", "cancelled")
    if cutoff_ms == 0.0:
        assert attempt.permit_held is None
        assert held_after_cancel == 0
    else:
        assert attempt.permit_held == {"reason": "caller-gave-up", "untilMs": admitted_at_ms}
        assert held_after_cancel == 1
    assert held_at_end == 0
    b_attempt = answered.decisions[0].attempts[0]
    assert answered.status == "completed"
    # B asked at 50 ms and was admitted when A's permit came back.
    assert b_attempt.evidence["queueDelayMs"] == pytest.approx(admitted_at_ms - 50.0)


def test_CNC_SCHED_HOLD_002_a_call_ended_by_its_own_deadline_releases_at_once():
    async def main(loop):
        registry = registry_with(loop, profile(providers={"fake": {"concurrency": 1}}))
        adapter = RemoteFake(None, default=FakeStep(latency_ms=800))
        first = request(ruleset_doc(1, timeoutMs=300))
        result = await evaluate_decision_ruleset(
            first, registry=registry, adapters={"fake": adapter}
        )
        return result, holds_pending(loop)

    result, held = run_virtual(main)
    attempt = result.decisions[0].attempts[0]
    assert (attempt.outcome, attempt.reason) == ("execution-uncertain", "timeout")
    assert attempt.permit_held is None
    assert held == 0
