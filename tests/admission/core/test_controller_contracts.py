"""Contracts of the controller that its callers and listeners rely on.

What a lease's release does with malformed figures, what a rejection says and to whom, when a
queued request behind a removed head is considered, when idle state is forgotten, and the exact
boundaries of the dispatch checks. Every test drives the public API on virtual time.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from admission.core import AdmissionRegistry, AdmissionRejected, VirtualTimeLoop

from .conftest import make_profile, rejection_of, request


def _listen(s):
    events = []
    s.registry.on_decision(events.append)
    return events


def _breaker(threshold: int = 1, open_ms: int = 1000) -> dict:
    return {"failureThreshold": threshold, "openMs": open_ms, "halfOpenMaxCalls": 1}


# ------------------------------------------------------------- release with malformed figures


def test_a_malformed_success_is_reported_and_counts_as_no_outcome(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 1, "circuitBreaker": _breaker()}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request())
        with pytest.raises(ValueError) as caught:
            lease.release(success="yes")
        assert str(caught.value) == "success must be True, False or None"
        assert lease.released
        assert s.controller.snapshot("alice") == (0, 0)
        # One failure would open this breaker: "yes" was no outcome at all.
        assert s.controller.breaker_transitions() == []
        again = await asyncio.wait_for(s.admit(request(budget="b")), 0.001)
        assert again.evidence.breaker_state == "closed"
        again.release()

    s.run(body)


def test_a_malformed_retry_after_is_reported_and_pauses_nothing(scenario_factory):
    s = scenario_factory()

    async def body(s):
        lease = await s.admit(request())
        with pytest.raises(ValueError) as caught:
            lease.release(retry_after_ms="soon")
        assert str(caught.value) == "retry_after_ms must be a finite non-negative number"
        start = s.now()
        again = await s.admit(request(budget="b"))
        assert s.now() == start
        assert again.evidence.retry_pressure == 0
        again.release()

    s.run(body)


def test_malformed_actual_figures_are_reported_and_not_reconciled(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 4, "maxTokens": 100}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request(budget="inv", tokens=60))
        with pytest.raises(ValueError) as caught:
            lease.release(actual_tokens=-5)
        assert str(caught.value) == "actual_tokens must be a non-negative integer"
        # The estimate of 60 still counts: another 50 would go over 100.
        error = await s.reject(request(budget="inv", tokens=50))
        assert error.reason == "tokens"
        (await s.admit(request(budget="inv", tokens=40))).release()

    s.run(body)


def test_a_malformed_actual_cost_is_reported_and_not_reconciled(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 4, "maxCostUsd": 1.0}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request(budget="inv", cost_usd=0.6))
        with pytest.raises(ValueError) as caught:
            lease.release(actual_cost_usd=float("nan"))
        assert str(caught.value) == "actual_cost_usd must be a finite non-negative number"
        error = await s.reject(request(budget="inv", cost_usd=0.5))
        assert error.reason == "cost"
        (await s.admit(request(budget="inv", cost_usd=0.4))).release()

    s.run(body)


def test_every_malformed_figure_is_reported_in_one_error_in_order(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 1, "circuitBreaker": _breaker()}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request())
        with pytest.raises(ValueError) as caught:
            lease.release(
                success=1, retry_after_ms=-1, actual_tokens=1.5, actual_cost_usd=float("inf")
            )
        assert caught.value.args == (
            "success must be True, False or None; "
            "retry_after_ms must be a finite non-negative number; "
            "actual_tokens must be a non-negative integer; "
            "actual_cost_usd must be a finite non-negative number",
        )
        assert s.controller.snapshot("alice") == (0, 0)
        assert s.controller.breaker_transitions() == []
        lease.release(success="again")  # released already: nothing to say
        start = s.now()
        (await s.admit(request(budget="b"))).release()
        assert s.now() == start

    s.run(body)


# ------------------------------------------------------------------- decisions and evidence


def test_a_rejection_is_evidenced_and_reported_without_a_retry_hint(scenario_factory):
    s = scenario_factory()
    events = _listen(s)

    async def body(s):
        req = request("mallory")
        error = await s.reject(req)
        assert error.reason == "unconfigured-principal"
        assert error.retry_after_ms is None
        assert error.evidence.decision == "reject"
        assert error.evidence.reason == "unconfigured-principal"
        assert error.evidence.retry_after_ms is None
        assert [(e.decision, e.reason, e.request, e.evidence) for e in events] == [
            ("reject", "unconfigured-principal", req, error.evidence)
        ]

    s.run(body)


def test_a_queued_request_rejected_for_another_reason_gets_no_hint(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1}})
    s = scenario_factory(profile)
    events = _listen(s)

    async def body(s):
        held = await s.admit(request(budget="h"))
        req = request(budget="w", deadline_ms=s.now() + 100)
        waiter = s.start(req)
        await asyncio.sleep(0.2)
        error = rejection_of(waiter)
        assert error.reason == "deadline-exceeded"
        assert error.retry_after_ms is None and error.evidence.retry_after_ms is None
        assert error.evidence.decision == "reject"
        assert (events[-1].decision, events[-1].reason, events[-1].request) == (
            "reject",
            "deadline-exceeded",
            req,
        )
        assert events[-1].evidence is error.evidence
        held.release()

    s.run(body)


def test_admissions_and_deferrals_are_reported_to_listeners(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1}})
    s = scenario_factory(profile)
    events = _listen(s)

    async def body(s):
        first = request(budget="a")
        lease = await s.admit(first)
        second = request(budget="b")
        waiter = s.start(second)
        await s.settle()
        lease.release()
        later = await waiter
        later.release()
        return lease, later, first, second

    lease, later, first, second = s.run(body)
    assert lease.evidence.decision == "admit" and lease.evidence.reason == "admitted"
    assert [(e.decision, e.reason, e.request, e.evidence) for e in events] == [
        ("admit", "admitted", first, lease.evidence),
        ("defer", "concurrency", second, None),
        ("admit", "admitted", second, later.evidence),
    ]
    assert later.principal_id == "alice" and later.provider_id == "llm"
    assert later.budget_id == "b"


def test_a_queue_timeout_carries_a_hint_of_half_the_dwell_bound_jittered(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueWaitMs": 4000}})
    hints = []
    for seed in range(12):
        s = scenario_factory(profile, seed=seed)
        events = _listen(s)

        async def body(s):
            held = await s.admit(request(budget="h"))
            waiter = s.start(request(budget="w"))
            await asyncio.sleep(4.5)
            held.release()
            return rejection_of(waiter)

        error = s.run(body)
        assert error.reason == "queue-timeout"
        assert error.retryable
        assert error.evidence.retry_after_ms == error.retry_after_ms
        assert events[-1].evidence.retry_after_ms == error.retry_after_ms
        expected = random.Random(seed).random()
        assert error.retry_after_ms == float(round(2000 * (0.5 + expected)))
        hints.append(error.retry_after_ms)
    assert all(1000 <= hint <= 3000 for hint in hints)


def test_a_queue_full_hint_without_bounds_is_about_a_second(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 1}})
    for seed in range(8):
        s = scenario_factory(profile, seed=seed)

        async def body(s):
            held = await s.admit(request(budget="h"))
            waiter = s.start(request(budget="w"))
            await s.settle()
            error = await s.reject(request(budget="x"))
            held.release()
            (await waiter).release()
            return error

        error = s.run(body)
        assert error.reason == "queue-full"
        assert error.evidence.decision == "reject" and error.evidence.reason == "queue-full"
        expected = float(round(1000 * (0.5 + random.Random(seed).random())))
        assert error.retry_after_ms == error.evidence.retry_after_ms == expected


def test_a_queue_full_hint_follows_the_remaining_retry_after_pause(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 1}})
    s = scenario_factory(profile, seed=3)

    async def body(s):
        await asyncio.sleep(20)  # the clock is far from zero
        held = await s.admit(request(budget="h"))
        waiter = s.start(request(budget="w"))
        await s.settle()
        s.controller.coordinate_retry_after("llm", 2000)
        await asyncio.sleep(0.5)
        error = await s.reject(request(budget="x"))
        held.release()
        (await waiter).release()
        return error

    error = s.run(body)
    expected = float(round(1500 * (0.5 + random.Random(3).random())))
    assert error.retry_after_ms == expected


def test_a_queue_full_hint_follows_the_remaining_open_breaker_time(scenario_factory):
    profile = make_profile(
        providers={"llm": {"concurrency": 4, "maxQueueLength": 1, "circuitBreaker": _breaker()}}
    )
    s = scenario_factory(profile, seed=5)

    async def body(s):
        await asyncio.sleep(10)
        (await s.admit(request(budget="f"))).release(success=False)
        await asyncio.sleep(0.25)
        waiter = s.start(request(budget="w"))
        await s.settle()
        error = await s.reject(request(budget="x"))
        (await waiter).release()
        return error

    error = s.run(body)
    expected = float(round(750 * (0.5 + random.Random(5).random())))
    assert error.retry_after_ms == expected


def test_retry_hints_are_bounded_to_thirty_seconds(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 1}})
    s = scenario_factory(profile, seed=1)

    async def body(s):
        held = await s.admit(request(budget="h"))
        waiter = s.start(request(budget="w"))
        await s.settle()
        s.controller.coordinate_retry_after("llm", 600_000)
        error = await s.reject(request(budget="x"))
        held.release()
        waiter.cancel()
        return error

    assert s.run(body).retry_after_ms == 30_000.0


# ------------------------------------------------------------------ removal of a lane's head


def test_when_the_head_leaves_the_next_waiter_of_its_lane_is_considered_at_once(scenario_factory):
    # The workspace allows one attempt per invocation; alice can hold one permit.
    profile = make_profile(
        workspace={"concurrency": 100, "maxAttempts": 1},
        principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}},
    )
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        head = s.start(request(budget="head"))
        behind = s.start(request(budget="spent"))
        await s.settle()
        # bob spends invocation "spent": alice's waiter behind the head can never be admitted.
        (await s.admit(request("bob", budget="spent"))).release()
        await s.settle()
        assert not behind.done()
        head.cancel()
        await s.settle()
        assert head.cancelled()
        assert behind.done() and rejection_of(behind).reason == "attempts"
        held.release()

    s.run(body)


def test_when_the_head_times_out_the_next_waiter_is_considered_at_once(scenario_factory):
    profile = make_profile(
        workspace={"concurrency": 100, "maxAttempts": 1},
        principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}},
    )
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        head = s.start(request(budget="head", deadline_ms=s.now() + 100))
        behind = s.start(request(budget="spent"))
        await s.settle()
        (await s.admit(request("bob", budget="spent"))).release()
        await asyncio.sleep(0.1)
        await s.settle()
        assert rejection_of(head).reason == "deadline-exceeded"
        assert behind.done() and rejection_of(behind).reason == "attempts"
        held.release()

    s.run(body)
