"""CNC-ADMIT-001..010: concurrency ceilings, buckets, budgets, static bounds and estimates."""

from __future__ import annotations

import math

import pytest

from admission.core import Estimate

from .conftest import make_profile, rejection_of, request


def test_CNC_ADMIT_001_principal_concurrency_queues_in_order(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 2}}))

    async def body(s):
        first = await s.admit(request(budget="a"))
        second = await s.admit(request(budget="b"))
        third = s.start(request(budget="c"))
        fourth = s.start(request(budget="d"))
        await s.settle()
        assert not third.done() and not fourth.done()
        assert s.controller.snapshot("alice") == (2, 2)
        first.release(success=True)
        await s.settle()
        assert third.done() and not fourth.done()
        lease = third.result()
        assert lease.evidence.active == 2
        assert lease.evidence.queued == 1  # the other waiter, not itself
        second.release(success=True)
        await s.settle()
        assert fourth.done()
        lease.release()
        fourth.result().release()
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_002_workspace_concurrency_is_shared_between_principals(scenario_factory):
    s = scenario_factory(make_profile(workspace={"concurrency": 1}))

    async def body(s):
        alice = await s.admit(request("alice"))
        bob = s.start(request("bob"))
        await s.settle()
        assert not bob.done()
        assert s.controller.snapshot("bob").queued == 1
        alice.release()
        await s.settle()
        assert bob.result().evidence.queue_delay_ms == 0.0
        bob.result().release()

    s.run(body)


def test_CNC_ADMIT_003_provider_concurrency_per_provider_lane(scenario_factory):
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 1}, "other": {"concurrency": 1}})
    )

    async def body(s):
        held = await s.admit(request("alice", "llm"))
        other = await s.admit(request("bob", "other"))  # another provider is not blocked
        waiting = s.start(request("bob", "llm"))
        await s.settle()
        assert not waiting.done()
        held.release()
        await s.settle()
        assert waiting.done()
        waiting.result().release()
        other.release()

    s.run(body)


def test_CNC_ADMIT_004_requests_per_minute_defers_then_refills_and_zero_rejects(scenario_factory):
    s = scenario_factory(
        make_profile(
            providers={
                "llm": {"concurrency": 10, "requestsPerMinute": 2},
                "off": {"concurrency": 1, "requestsPerMinute": 0},
            }
        )
    )

    async def body(s):
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release()
        start = s.now()
        third = await s.admit(request(budget="c"))
        # One request refills every 30 s at 2 per minute.
        assert s.now() - start == pytest.approx(30_000, abs=0.01)
        assert third.evidence.queue_delay_ms == pytest.approx(30_000, abs=0.01)
        third.release()
        error = await s.reject(request(provider="off"))
        assert error.reason == "requests-per-minute" and not error.retryable
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_005_tokens_per_second_defers_and_never_fit_rejects(scenario_factory):
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 10, "tokensPerSecond": 1000}})
    )

    async def body(s):
        (await s.admit(request(budget="a", tokens=800))).release()
        start = s.now()
        lease = await s.admit(request(budget="b", tokens=600))
        assert s.now() - start == pytest.approx(400, abs=0.01)  # 400 tokens at 1 per ms
        lease.release()
        error = await s.reject(request(budget="c", tokens=1001))
        assert error.reason == "tokens-per-second" and not error.retryable
        # An unknown token estimate counts as zero against the bucket.
        (await s.admit(request(budget="d"))).release()

    s.run(body)


def test_CNC_ADMIT_006_attempt_budget_per_invocation_and_exact_release(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 10, "maxAttempts": 2}}))

    async def body(s):
        for _ in range(2):
            (await s.admit(request(budget="inv-1"))).release(success=False)
        error = await s.reject(request(budget="inv-1"))
        assert error.reason == "attempts" and not error.retryable
        # Another invocation whose id shares a prefix keeps its own budget.
        (await s.admit(request(budget="inv-10"))).release()
        (await s.admit(request(budget="inv-10"))).release()
        s.controller.release_budget("inv-1")
        (await s.admit(request(budget="inv-1"))).release()
        assert (await s.reject(request(budget="inv-10"))).reason == "attempts"
        # An estimate that consumes several attempts at once is refused when it cannot fit.
        s.controller.release_budget("inv-2")
        assert (await s.reject(request(budget="inv-2", attempts=3))).reason == "attempts"

    s.run(body)


def test_CNC_ADMIT_007_cost_budget_and_fail_closed_unknown_cost(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 10, "maxCostUsd": 1.0},
            providers={"llm": {"concurrency": 10}, "lenient": {"concurrency": 10}},
        )
    )

    async def body(s):
        assert (await s.reject(request())).reason == "unknown-cost"
        (await s.admit(request(cost_usd=0.6))).release()
        error = await s.reject(request(cost_usd=0.5))
        assert error.reason == "cost" and not error.retryable
        (await s.admit(request(cost_usd=0.4))).release()
        s.controller.release_budget("inv-1")
        (await s.admit(request(cost_usd=1.0))).release()

    s.run(body)

    lenient = scenario_factory(
        make_profile(workspace={"concurrency": 10, "maxCostUsd": 1.0, "allowUnknownCost": True})
    )

    async def lenient_body(s):
        (await s.admit(request())).release()

    lenient.run(lenient_body)


def test_CNC_ADMIT_008_cumulative_token_reservation(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 10, "maxTokens": 1000}}))

    async def body(s):
        assert (await s.reject(request())).reason == "unknown-tokens"
        lease = await s.admit(request(tokens=700))
        assert (await s.reject(request(tokens=400))).reason == "tokens"
        # Reconciling with the real usage gives the unused reservation back.
        lease.release(success=True, actual_tokens=300)
        (await s.admit(request(tokens=700))).release(success=True)
        assert (await s.reject(request(tokens=1))).reason == "tokens"

    s.run(body)


def test_CNC_ADMIT_009_static_bounds_in_scope_order(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 10, "maxBatchSize": 4, "maxRequestBytes": 100},
            providers={"llm": {"concurrency": 10, "maxItems": 3, "maxRetainedWork": 5}},
            principals={"alice": {"concurrency": 10, "maxBatchSize": 8}},
        )
    )

    async def body(s):
        cases = [
            ({"batch_size": 5, "retained_work": 1}, "batch-size"),
            ({"request_bytes": 101, "retained_work": 1}, "request-too-large"),
            ({"items": 4, "retained_work": 1}, "too-many-items"),
            ({}, "unknown-retained-work"),
            ({"retained_work": 6}, "retained-work"),
        ]
        for estimate, reason in cases:
            error = await s.reject(request(**estimate))
            assert error.reason == reason, estimate
        # The principal scope is judged first: its batch bound of 8 decides over the
        # provider's missing retained-work estimate only when it fails.
        error = await s.reject(request(batch_size=9))
        assert error.reason == "batch-size"
        (
            await s.admit(request(batch_size=4, request_bytes=100, items=3, retained_work=5))
        ).release()
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


@pytest.mark.parametrize(
    "estimate",
    [
        {"tokens": -1},
        {"tokens": 1.5},
        {"tokens": True},
        {"tokens": "10"},
        {"tokens": math.nan},
        {"cost_usd": -0.01},
        {"cost_usd": math.inf},
        {"cost_usd": False},
        {"request_bytes": math.inf},
        {"items": -3},
        {"attempts": 0.5},
        {"batch_size": [1]},
        {"retained_work": None, "tokens": -5},
    ],
)
def test_CNC_ADMIT_010_malformed_estimates_fail_closed(scenario_factory, estimate):
    s = scenario_factory(
        make_profile(
            principals={"alice": {"concurrency": 1, "maxQueueLength": 5}},
            workspace={"concurrency": 5, "maxCostUsd": 1, "allowUnknownCost": True},
        )
    )

    async def body(s):
        holder = await s.admit(request(budget="holder"))
        # Even behind a busy lane the malformed request is refused before it takes a queue slot.
        error = await s.reject(request(**estimate))
        assert error.reason == "invalid-estimate" and not error.retryable
        assert error.evidence.estimated_tokens is None
        assert error.evidence.estimated_cost_usd is None
        assert s.controller.snapshot("alice") == (1, 0)
        holder.release()
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_010_estimate_is_not_validated_on_construction():
    estimate = Estimate(tokens="lots", cost_usd=-1)
    assert estimate.tokens == "lots" and estimate.cost_usd == -1


def test_queued_request_is_admitted_in_arrival_order_across_deferrals(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))

    async def body(s):
        holder = await s.admit(request(budget="h"))
        tasks = [s.start(request(budget=f"w{i}")) for i in range(5)]
        await s.settle()
        order = []
        lease = holder
        for _ in range(5):
            lease.release()
            await s.settle()
            done = [i for i, t in enumerate(tasks) if t.done() and i not in order]
            assert len(done) == 1
            order.extend(done)
            lease = tasks[done[0]].result()
        lease.release()
        assert order == [0, 1, 2, 3, 4]
        assert all(not t.cancelled() for t in tasks)
        for task in tasks:
            assert task.exception() is None

    s.run(body)


def test_rejection_helper_reports_type(scenario_factory):
    s = scenario_factory()

    async def body(s):
        task = s.start(request("mallory"))
        await s.settle()
        assert rejection_of(task).reason == "unconfigured-principal"

    s.run(body)


def test_actual_figures_at_release_correct_the_invocation_budgets(scenario_factory):
    s = scenario_factory(
        make_profile(
            providers={"llm": {"concurrency": 10, "maxTokens": 100}},
            principals={"alice": {"concurrency": 10, "maxCostUsd": 1.0}},
        )
    )

    async def body(s):
        # Estimated 80 tokens and $0.80; the provider reports no tokens and $0.25.
        lease = await s.admit(request(budget="inv", tokens=80, cost_usd=0.8))
        lease.release(actual_tokens=0, actual_cost_usd=0.25)
        # Estimated no tokens; 10 were used.
        (await s.admit(request(budget="inv", tokens=0, cost_usd=0.0))).release(actual_tokens=10)
        # Left: 90 tokens (provider budget) and $0.75 (principal budget), to the unit.
        over_tokens = (await s.reject(request(budget="inv", tokens=91, cost_usd=0.0))).reason
        over_cost = (await s.reject(request(budget="inv", tokens=0, cost_usd=0.76))).reason
        (await s.admit(request(budget="inv", tokens=90, cost_usd=0.75))).release()
        return over_tokens, over_cost

    assert s.run(body) == ("tokens", "cost")
