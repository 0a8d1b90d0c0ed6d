"""CNC-SCHED: the bounded scheduler, fair lanes, canonical order and retry backoff."""

from __future__ import annotations

import itertools

import pytest

from admission.core import CancelSignal
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.receipts import InMemoryReceiptStore
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import (
    PRINCIPAL,
    decision_doc,
    profile,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)


def spans(adapter: FakeAdapter) -> list[tuple[str, float, float]]:
    return [(call.decision_id, call.started_ms, call.ended_ms) for call in adapter.calls]


def assert_serial(adapter: FakeAdapter) -> None:
    calls = sorted(adapter.calls, key=lambda call: call.started_ms)
    for before, after in itertools.pairwise(calls):
        assert after.started_ms >= before.ended_ms, (before, after)


def test_CNC_SCHED_001_disabled_scheduler_is_strictly_serial_whatever_the_ceilings():
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(default=FakeStep(latency_ms=10))
        req = request(
            ruleset_doc(5),
            callerConcurrency=8,
            graphConcurrency=8,
            scheduler={"bindingConcurrency": 8},
        )
        result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
        return result, fake, loop.time()

    result, fake, elapsed = run_virtual(main)
    assert result.concurrency == 1 and result.max_active == 1 and fake.max_active == 1
    assert [d.decision_id for d in result.decisions] == [f"d{i}" for i in range(5)]
    assert [call.decision_id for call in fake.calls] == [f"d{i}" for i in range(5)]
    assert_serial(fake)
    assert elapsed == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        ({"binding": 2}, 2),
        ({"caller": 3}, 3),
        ({"graph": 2}, 2),
        ({"principal": 3}, 3),
        ({"workspace": 2}, 2),
        ({"provider": 3}, 3),
        ({"binding": 6, "caller": 5, "graph": 4, "principal": 6, "workspace": 6}, 4),
    ],
)
def test_CNC_SCHED_002_enabled_scheduler_is_bounded_by_the_smallest_positive_ceiling(
    bounds, expected
):
    async def main(loop):
        prof = profile(
            workspace={"concurrency": bounds.get("workspace", 16)},
            providers={"fake": {"concurrency": bounds.get("provider", 16)}},
            principals={PRINCIPAL: {"concurrency": bounds.get("principal", 16)}},
        )
        registry = registry_with(loop, prof)
        fake = FakeAdapter(default=FakeStep(latency_ms=10))
        fields = {"scheduler": {"enabled": True, "bindingConcurrency": bounds.get("binding", 16)}}
        if "caller" in bounds:
            fields["callerConcurrency"] = bounds["caller"]
        if "graph" in bounds:
            fields["graphConcurrency"] = bounds["graph"]
        result = await evaluate_decision_ruleset(
            request(ruleset_doc(12), **fields), registry=registry, adapters={"fake": fake}
        )
        return result, fake

    result, fake = run_virtual(main)
    assert result.concurrency == expected
    assert result.max_active == expected
    assert fake.max_active == expected
    assert all(d.succeeded for d in result.decisions)


def test_CNC_SCHED_003_results_keep_canonical_order_when_completions_arrive_reversed():
    async def main(loop):
        registry = registry_with(loop, profile())
        # Earlier decisions are slower, so they finish last.
        fake = FakeAdapter(
            responder=lambda call: FakeStep(
                latency_ms=100 - 10 * int(call.decision_id[1:]),
                answer="yes" if int(call.decision_id[1:]) % 2 else "no",
            )
        )
        req = request(ruleset_doc(8), scheduler={"enabled": True, "bindingConcurrency": 8})
        result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
        return result, fake

    result, fake = run_virtual(main)
    finish_order = [c.decision_id for c in sorted(fake.calls, key=lambda c: c.ended_ms)]
    assert finish_order == [f"d{i}" for i in reversed(range(8))]
    assert [d.decision_id for d in result.decisions] == [f"d{i}" for i in range(8)]
    assert list(result.outputs.values()) == ["no", "yes"] * 4


def test_CNC_SCHED_004_lanes_by_first_target_adapter_are_served_round_robin():
    async def main(loop):
        prof = profile(
            providers={"alpha": {"concurrency": 8}, "beta": {"concurrency": 8}},
        )
        registry = registry_with(loop, prof)
        alpha = FakeAdapter(default=FakeStep(latency_ms=10))
        beta = FakeAdapter(default=FakeStep(latency_ms=10))
        decisions = [decision_doc(f"a{i}", adapter="alpha") for i in range(6)]
        decisions += [decision_doc(f"b{i}", adapter="beta") for i in range(2)]
        req = request(
            {"id": "lanes", "decisions": decisions},
            scheduler={"enabled": True, "bindingConcurrency": 2},
        )
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"alpha": alpha, "beta": beta}
        )
        return result, alpha, beta

    result, alpha, beta = run_virtual(main)
    starts = sorted(alpha.calls + beta.calls, key=lambda c: (c.started_ms, c.decision_id))
    # The quiet lane's two decisions start in the first two rounds, not after alpha's backlog.
    assert [c.decision_id for c in starts[:4]] == ["a0", "b0", "a1", "b1"]
    assert max(c.started_ms for c in beta.calls) == 10.0
    assert [d.decision_id for d in result.decisions] == [f"a{i}" for i in range(6)] + ["b0", "b1"]


def test_CNC_SCHED_004_queued_decisions_are_cancelled_before_any_adapter_call():
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(default=FakeStep(latency_ms=100))
        caller = CancelSignal()
        loop.call_later(0.05, caller.cancel, "caller-gave-up")
        req = request(ruleset_doc(4), signal=caller)
        result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
        return result, fake

    result, fake = run_virtual(main)
    assert result.status == "cancelled"
    assert [c.decision_id for c in fake.calls] == ["d0"]
    first, *rest = result.decisions
    assert first.status == "execution-uncertain" and first.attempts[0].reason == "cancelled"
    assert [d.status for d in rest] == ["cancelled"] * 3
    assert all(d.attempts == () for d in rest)


def retry_ruleset():
    """d0 fails once (server error) with a 100 ms backoff; d1..d3 are plain."""
    decisions = [
        decision_doc(
            "d0",
            retry={"maxAttempts": 2, "initialBackoffMs": 100, "maxBackoffMs": 100},
        )
    ]
    decisions += [decision_doc(f"d{i}") for i in range(1, 4)]
    return {"id": "backoff", "decisions": decisions}


def retry_adapter():
    return FakeAdapter(
        {"d0": [FakeStep(latency_ms=10, error="server-error"), FakeStep(latency_ms=10)]},
        default=FakeStep(latency_ms=40),
    )


@pytest.mark.parametrize("receipts", [False, True], ids=["no-receipts", "receipts"])
def test_CNC_SCHED_BACKOFF_001_scheduled_retry_lends_its_permit_out_during_backoff(receipts):
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = retry_adapter()
        req = request(retry_ruleset(), scheduler={"enabled": True, "bindingConcurrency": 1})
        result = await evaluate_decision_ruleset(
            req,
            registry=registry,
            adapters={"fake": fake},
            receipt_store=InMemoryReceiptStore() if receipts else None,
        )
        return result, fake

    result, fake = run_virtual(main)
    assert result.concurrency == 1
    assert fake.max_active == 1 and result.max_active == 1
    # d1 ran inside d0's 100 ms backoff (10..110).
    d1 = next(c for c in fake.calls if c.decision_id == "d1")
    assert (d1.started_ms, d1.ended_ms) == (10.0, 50.0)
    assert all(d.succeeded for d in result.decisions)
    assert [a.outcome for a in result.decisions[0].attempts] == ["provider-error", "succeeded"]


def test_CNC_SCHED_BACKOFF_002_a_retry_resumes_ahead_of_work_that_has_not_started():
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = retry_adapter()
        ruleset = retry_ruleset()
        ruleset["decisions"][0]["binding"]["primary"]["retry"] = {
            "maxAttempts": 2,
            "initialBackoffMs": 30,
            "maxBackoffMs": 30,
        }
        req = request(ruleset, scheduler={"enabled": True, "bindingConcurrency": 1})
        result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
        return result, fake

    result, fake = run_virtual(main)
    # d0's backoff ends at 40 while d1 runs (10..50); at 50 the permit goes to d0, not to d2.
    assert [(c.decision_id, c.attempt, c.started_ms) for c in fake.calls] == [
        ("d0", 1, 0.0),
        ("d1", 1, 10.0),
        ("d0", 2, 50.0),
        ("d2", 1, 60.0),
        ("d3", 1, 100.0),
    ]
    assert fake.max_active == 1
    assert [d.decision_id for d in result.decisions] == ["d0", "d1", "d2", "d3"]


@pytest.mark.parametrize("receipts", [False, True], ids=["no-receipts", "receipts"])
def test_CNC_SCHED_BACKOFF_003_serial_runs_hold_the_permit_through_backoff(receipts):
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = retry_adapter()
        store = InMemoryReceiptStore() if receipts else None
        req = request(retry_ruleset(), scheduler={"enabled": False, "bindingConcurrency": 4})
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        return result, fake

    result, fake = run_virtual(main)
    assert result.concurrency == 1
    assert [(c.decision_id, c.attempt, c.started_ms) for c in fake.calls] == [
        ("d0", 1, 0.0),
        ("d0", 2, 110.0),
        ("d1", 1, 120.0),
        ("d2", 1, 160.0),
        ("d3", 1, 200.0),
    ]
    assert_serial(fake)


def test_CNC_SCHED_BACKOFF_003_cancellation_during_backoff_is_honoured_at_once():
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(
            {"d0": [FakeStep(latency_ms=10, error="server-error")]},
            default=FakeStep(latency_ms=10),
        )
        caller = CancelSignal()
        loop.call_later(0.030, caller.cancel, "caller-gave-up")
        decisions = [
            decision_doc(
                "d0", retry={"maxAttempts": 3, "initialBackoffMs": 60_000, "maxBackoffMs": 60_000}
            ),
            decision_doc("d1"),
        ]
        req = request({"id": "cancel", "decisions": decisions}, signal=caller)
        result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
        return result, fake, loop.time()

    result, fake, elapsed = run_virtual(main)
    assert elapsed == pytest.approx(0.030)
    assert result.status == "cancelled"
    assert [d.status for d in result.decisions] == ["cancelled", "cancelled"]
    assert len(fake.calls) == 1


def test_a_retry_does_not_wait_when_the_invocation_attempt_budget_is_spent():
    async def main(loop):
        prof = profile(principals={PRINCIPAL: {"concurrency": 4, "maxAttempts": 1}})
        registry = registry_with(loop, prof)
        fake = FakeAdapter({"d0": [FakeStep(latency_ms=10, error="server-error")]})
        ruleset = {
            "id": "budget",
            "decisions": [
                decision_doc(
                    "d0", retry={"maxAttempts": 3, "initialBackoffMs": 5_000, "maxBackoffMs": 5_000}
                )
            ],
        }
        result = await evaluate_decision_ruleset(
            request(ruleset), registry=registry, adapters={"fake": fake}
        )
        return result, fake, loop.time()

    result, fake, elapsed = run_virtual(main)
    assert elapsed == pytest.approx(0.010)
    (decision,) = result.decisions
    assert [a.reason for a in decision.attempts] == ["http-503", "attempts"]
    assert decision.status == "budget-exhausted"
    assert len(fake.calls) == 1


def test_CNC_SCHED_004_a_signal_fired_before_the_run_began_dispatches_nothing():
    # A run cancelled before its worker started it (evaluator/worker/cancel_watch.py) arrives so.
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(default=FakeStep(latency_ms=100))
        caller = CancelSignal()
        caller.cancel("cancelled")
        store = InMemoryReceiptStore()
        req = request(ruleset_doc(3), signal=caller)
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        return result, fake

    result, fake = run_virtual(main)
    assert result.status == "cancelled"
    assert fake.calls == []
    assert [d.status for d in result.decisions] == ["cancelled"] * 3
    assert all(d.attempts == () for d in result.decisions)
