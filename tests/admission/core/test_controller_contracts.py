"""Contracts of the controller that its callers and listeners rely on.

What a lease's release does with malformed figures, what a rejection says and to whom, when a
queued request behind a removed head is considered, when idle state is forgotten, and the exact
boundaries of the dispatch checks. Every test drives the public API on virtual time.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from admission.core import AdmissionRegistry, CancelSignal, Profile, VirtualTimeLoop

from .conftest import make_profile, profile_doc, rejection_of, request


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
        # Refused before any scope was looked up: no counts, no breaker.
        assert (error.evidence.active, error.evidence.queued) == (0, 0)
        assert error.evidence.breaker_state == "closed"
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


async def _hint_behind_a_pause(s, pause_ms):
    """The retry hint of a queue-full rejection while the provider is paused for `pause_ms`."""
    held = await s.admit(request(budget="h"))
    waiter = s.start(request(budget="w"))
    await s.settle()
    s.controller.coordinate_retry_after("llm", pause_ms)
    error = await s.reject(request(budget="x"))
    held.release()
    waiter.cancel()
    return error.retry_after_ms


@pytest.mark.parametrize(
    ("pause_ms", "hints"),
    [
        (600_000, {30_000.0}),  # at most thirty seconds, however long the pause
        (0.5, {1.0}),  # never under a millisecond
        (1, {1.0, 2.0}),  # a millisecond, jittered 0.5x to 1.5x and rounded
    ],
)
def test_retry_hints_are_bounded(scenario_factory, pause_ms, hints):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 1}})
    for seed in range(6):
        s = scenario_factory(profile, seed=seed)
        assert s.run(lambda s: _hint_behind_a_pause(s, pause_ms)) in hints


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


# -------------------------------------------------------------- forgetting idle principals


def _crowd(count: int, **limits):
    names = [f"p{n}" for n in range(count)]
    principals = {name: {"concurrency": 1, **limits} for name in names}
    principals["holder"] = {"concurrency": 1}
    return names, make_profile(providers={"llm": {"concurrency": 1}}, principals=principals)


def _bounded_registry(max_idle_scopes: int):
    loop = VirtualTimeLoop()
    return loop, AdmissionRegistry(clock=loop.clock, max_idle_scopes=max_idle_scopes)


def test_principals_whose_waiters_are_cancelled_are_forgotten_beyond_the_bound():
    names, profile = _crowd(30)
    loop, registry = _bounded_registry(2)
    controller = registry.register(profile)

    async def body():
        held = await controller.acquire(request("holder", budget="h"))
        for name in names:
            task = loop.create_task(controller.acquire(request(name, budget=f"inv-{name}")))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        kept = set(controller._principals)
        # A forgotten principal's pair in the provider pool goes with it.
        assert set(controller._providers["llm"].pairs) == kept
        held.release()
        return kept

    try:
        kept = loop.run_until_complete(body())
    finally:
        loop.close()
    # The holder (busy all along) and no more than the bound of idle ones, plus the last noted.
    assert "holder" in kept
    assert len(kept) <= 1 + 2 + 1


def test_principals_whose_waiters_time_out_are_forgotten_beyond_the_bound():
    names, profile = _crowd(30, maxQueueWaitMs=10)
    loop, registry = _bounded_registry(2)
    controller = registry.register(profile)

    async def body():
        held = await controller.acquire(request("holder", budget="h"))
        for name in names:
            task = loop.create_task(controller.acquire(request(name, budget=f"inv-{name}")))
            await asyncio.sleep(0.02)
            assert rejection_of(task).reason == "queue-timeout"
        kept = set(controller._principals)
        held.release()
        return kept

    try:
        kept = loop.run_until_complete(body())
    finally:
        loop.close()
    assert "holder" in kept
    assert len(kept) <= 1 + 2 + 1


def test_released_budgets_let_idle_principals_be_forgotten():
    names = [f"p{n}" for n in range(30)]
    loop, registry = _bounded_registry(2)
    controller = registry.register(
        make_profile(principals={name: {"concurrency": 1, "maxAttempts": 3} for name in names})
    )

    async def body():
        leases = [await controller.acquire(request(name, budget=f"inv-{name}")) for name in names]
        for lease in leases:
            lease.release()  # each still keeps its budget: nobody can be forgotten yet
        assert len(controller._principals) == len(names)
        for name in names:
            controller.release_budget(f"inv-{name}")
        return len(controller._principals)

    try:
        # Each note looks at two candidates at most, so a few of the entries re-queued while
        # budgets were held linger: the bound and three more, not thirty.
        assert loop.run_until_complete(body()) <= 2 + 3
    finally:
        loop.close()


def test_a_principal_that_still_waits_or_holds_is_never_forgotten():
    names, profile = _crowd(20)
    loop, registry = _bounded_registry(1)
    controller = registry.register(profile)

    async def body():
        held = await controller.acquire(request("holder", budget="h"))
        stays = loop.create_task(controller.acquire(request("p0", budget="stay")))
        await asyncio.sleep(0)
        for name in names[1:]:
            task = loop.create_task(controller.acquire(request(name, budget=f"inv-{name}")))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert {"holder", "p0"} <= set(controller._principals)
        assert controller.snapshot("p0") == (0, 1)
        held.release()
        await asyncio.sleep(0)
        lease = await stays
        assert controller.snapshot("p0") == (1, 0)
        lease.release()

    try:
        loop.run_until_complete(body())
    finally:
        loop.close()


def test_an_idle_controller_is_evicted_only_once_its_budgets_are_released():
    loop, registry = _bounded_registry(1)
    first = registry.register(make_profile(principals={"alice": {"concurrency": 1}}))
    other = registry.register(Profile.from_dict(profile_doc(), workspace_id="ws-2"))

    async def body():
        lease = await first.acquire(request(budget="inv"))
        assert first.is_busy()
        lease.release()
        assert not first.is_busy()
        assert first.is_idle(loop.clock.monotonic_ms()) is False  # it keeps the budget of "inv"
        (await other.acquire(request(budget="x", workspace="ws-2"))).release()
        other.release_budget("x")
        # Two controllers, one may idle: other goes, first keeps its budget of "inv".
        assert other.evicted and not first.evicted
        (await other.acquire(request(budget="y", workspace="ws-2"))).release()  # re-adopted
        assert not other.evicted and registry.controller("ws-2") is other
        assert not first.evicted
        first.release_budget("inv")  # first is idle now; other still keeps "y"
        assert first.evicted and not other.evicted
        again = await first.acquire(request(budget="inv2"))
        assert not first.evicted and registry.controller("ws-1") is first
        assert first.is_busy()
        again.release()

    try:
        loop.run_until_complete(body())
    finally:
        loop.close()


# ------------------------------------------------------------------- profiles and snapshots


def test_a_new_profile_recompiles_the_static_limits_each_time(scenario_factory):
    def version(label: str, batch: int):
        return make_profile(
            version=label, principals={"alice": {"concurrency": 4, "maxBatchSize": batch}}
        )

    s = scenario_factory(version("v1", 10))

    async def body(s):
        assert (await s.reject(request(budget="a", batch_size=50))).reason == "batch-size"
        s.registry.register(version("v2", 100))
        (await s.admit(request(budget="b", batch_size=50))).release()
        s.registry.register(version("v3", 10))
        assert (await s.reject(request(budget="c", batch_size=50))).reason == "batch-size"
        s.registry.register(version("v4", 100))
        (await s.admit(request(budget="d", batch_size=50))).release()

    s.run(body)


def test_a_new_profile_keeps_rate_buckets_and_unnames_scopes(scenario_factory):
    first = make_profile(
        version="v1",
        workspace={"concurrency": 10, "requestsPerMinute": 600},
        providers={"llm": {"concurrency": 10, "tokensPerSecond": 1000}, "old": {"concurrency": 1}},
        principals={
            "alice": {"concurrency": 4, "requestsPerMinute": 600},
            "bob": {"concurrency": 1},
        },
    )
    second = make_profile(
        version="v2",
        workspace={"concurrency": 10, "requestsPerMinute": 600},
        providers={"llm": {"concurrency": 10, "tokensPerSecond": 1000}},
        principals={"alice": {"concurrency": 4, "requestsPerMinute": 600}},
    )
    s = scenario_factory(first)

    async def body(s):
        (await s.admit(request(budget="a", tokens=10))).release()
        (await s.admit(request("bob", "old", budget="b"))).release()
        s.registry.register(second)
        (await s.admit(request(budget="c", tokens=10))).release()
        assert (await s.reject(request("bob", budget="d"))).reason == "unconfigured-principal"
        assert (await s.reject(request(budget="e", provider="old"))).reason == (
            "unconfigured-provider"
        )
        with pytest.raises(ValueError) as caught:
            s.controller.coordinate_retry_after("old", 10)
        assert str(caught.value) == "provider is not configured in the current profile"
        with pytest.raises(ValueError) as caught:
            s.controller.coordinate_retry_after("nowhere", 10)
        assert str(caught.value) == "provider is not configured in the current profile"

    s.run(body)


def test_coordinate_retry_after_refuses_a_malformed_pause(scenario_factory):
    s = scenario_factory()
    for ms in (-1, float("nan"), "10", True):
        with pytest.raises(ValueError) as caught:
            s.controller.coordinate_retry_after("llm", ms)
        assert str(caught.value) == "retry-after milliseconds must be a finite non-negative number"


def test_a_request_for_another_workspace_is_refused_with_its_message(scenario_factory):
    s = scenario_factory()

    async def body(s):
        with pytest.raises(ValueError) as caught:
            await s.admit(request(workspace="ws-2"))
        assert str(caught.value) == (
            "request.workspace_id does not match this controller's workspace"
        )

    s.run(body)


def test_a_snapshot_of_an_unknown_principal_is_empty(scenario_factory):
    s = scenario_factory()
    snapshot = s.controller.snapshot("nobody")
    assert (snapshot.active, snapshot.queued) == (0, 0)


# ---------------------------------------------------------------- expiry and dispatch bounds


def test_a_deadline_before_the_dwell_bound_expires_as_deadline_exceeded(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxQueueWaitMs": 500}})
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        start = s.now()
        early = s.start(request(budget="a", deadline_ms=start + 200))
        same = s.start(request(budget="c", deadline_ms=start + 500))
        late = s.start(request(budget="b", deadline_ms=start + 900))
        await asyncio.sleep(0.2)
        await s.settle()
        assert rejection_of(early).reason == "deadline-exceeded"
        assert not late.done() and not same.done()
        await asyncio.sleep(0.3)
        await s.settle()
        assert rejection_of(late).reason == "queue-timeout"
        # Both ends at once: the deadline is named.
        assert rejection_of(same).reason == "deadline-exceeded"
        held.release()

    s.run(body)


def test_a_pause_ending_exactly_now_admits_at_once(scenario_factory):
    s = scenario_factory()

    async def body(s):
        s.controller.coordinate_retry_after("llm", 250)
        start = s.now()
        lease = await s.admit(request(budget="a"))
        assert s.now() - start == pytest.approx(250)
        lease.release()
        s.controller.coordinate_retry_after("llm", 100)
        await asyncio.sleep(0.1)
        at = s.now()
        (await s.admit(request(budget="b"))).release()
        assert s.now() == at

    s.run(body)


def test_a_bucket_with_exactly_one_request_left_admits_and_refills_on_time(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 4, "requestsPerMinute": 6000}})
    s = scenario_factory(profile)

    async def body(s):
        start = s.now()
        leases = []
        for n in range(6000):
            leases.append(await s.admit(request(budget=f"b{n}")))
            leases.pop().release()
        assert s.now() == start
        (await s.admit(request(budget="next"))).release()
        return s.now() - start

    assert s.run(body) == pytest.approx(10)


def test_a_token_bucket_holding_exactly_the_estimate_admits_at_once(scenario_factory):
    profile = make_profile(workspace={"concurrency": 10, "tokensPerSecond": 1000})
    s = scenario_factory(profile)

    async def body(s):
        lease = await asyncio.wait_for(s.admit(request(budget="a", tokens=1000)), 0.001)
        lease.release()
        start = s.now()
        (await s.admit(request(budget="b", tokens=250))).release()
        return s.now() - start

    assert s.run(body) == pytest.approx(250)


def test_a_queued_request_with_a_deadline_is_admitted_when_a_permit_frees(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1}})
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        waiter = s.start(request(budget="w", deadline_ms=s.now() + 5000))
        await asyncio.sleep(1)
        held.release()
        await s.settle()
        assert waiter.done() and waiter.exception() is None
        waiter.result().release()

    s.run(body)


def test_a_head_refused_when_served_lets_the_next_waiter_in_at_once(scenario_factory):
    profile = make_profile(
        workspace={"concurrency": 100, "maxAttempts": 1},
        principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}},
    )
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        head = s.start(request(budget="spent"))
        behind = s.start(request(budget="fresh"))
        await s.settle()
        (await s.admit(request("bob", budget="spent"))).release()
        held.release()
        await s.settle()
        assert rejection_of(head).reason == "attempts"
        assert behind.done() and behind.exception() is None
        behind.result().release()

    s.run(body)


def test_the_provider_queue_bound_counts_every_waiter(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 1, "maxQueueLength": 2}})
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        waiters = [s.start(request(name, budget=name)) for name in ("alice", "bob")]
        await s.settle()
        error = await s.reject(request("alice", budget="third"))
        assert error.reason == "queue-full"
        held.release()
        for task in waiters:
            (await task).release()

    s.run(body)


def test_a_retry_hint_ignores_a_breaker_the_profile_no_longer_configures(scenario_factory):
    def version(label, breaker):
        llm = {"concurrency": 4, "maxQueueLength": 1}
        if breaker:
            llm["circuitBreaker"] = _breaker()
        return make_profile(version=label, providers={"llm": llm})

    s = scenario_factory(version("v1", True), seed=2)

    async def body(s):
        (await s.admit(request(budget="ok"))).release(success=True)
        s.registry.register(version("v2", False))
        s.controller.coordinate_retry_after("llm", 100)
        waiter = s.start(request(budget="w"))
        await s.settle()
        error = await s.reject(request(budget="x"))
        (await waiter).release()
        return error

    expected = float(round(100 * (0.5 + random.Random(2).random())))
    assert s.run(body).retry_after_ms == expected


def test_a_probe_of_an_earlier_opening_has_no_say_after_the_breaker_reopens(scenario_factory):
    profile = make_profile(
        providers={
            "llm": {
                "concurrency": 10,
                "circuitBreaker": {"failureThreshold": 1, "openMs": 1000, "halfOpenMaxCalls": 2},
            }
        }
    )
    s = scenario_factory(profile)

    async def body(s):
        (await s.admit(request(budget="f"))).release(success=False)  # opening 1
        first = await s.admit(request(budget="p1"))
        stale = await s.admit(request(budget="p2"))  # both probes of opening 1
        first.release(success=False)  # opening 2
        probe = await s.admit(request(budget="p3"))  # half-open again after openMs
        assert probe.evidence.breaker_state == "half-open"
        stale.release(success=True)  # from opening 1: ignored
        states = [t.to_state for t in s.controller.breaker_transitions()]
        probe.release(success=None)
        return states

    assert s.run(body) == ["open", "half-open", "open", "half-open"]


def _workspace_reserved_profile():
    # One workspace pool of three permits; a and b each hold one back for themselves.
    return make_profile(
        workspace={"concurrency": 3},
        providers={"llm": {"concurrency": 100}},
        principals={
            "a": {"concurrency": 3, "reservedConcurrency": 1},
            "b": {"concurrency": 3, "reservedConcurrency": 1},
            "c": {"concurrency": 3},
        },
    )


def test_a_second_permit_above_a_workspace_reservation_leaves_anothers_alone(scenario_factory):
    s = scenario_factory(_workspace_reserved_profile())

    async def body(s):
        held = [await s.admit(request("a", budget=f"a{n}")) for n in range(2)]
        blocked = s.start(request("c", budget="c1"))
        await s.settle()
        assert not blocked.done()  # the last permit is b's reservation
        held.pop().release()
        await s.settle()
        # a is back at its reservation: the permit it gave back is free for c.
        assert blocked.done() and blocked.exception() is None
        blocked.result().release()
        held.pop().release()

    s.run(body)


def test_a_recently_served_principal_is_kept_while_earlier_lanes_wait():
    names = [f"p{n}" for n in range(6)]
    loop, registry = _bounded_registry(1)
    principals = {name: {"concurrency": 1} for name in [*names, "x", "y"]}
    principals["w"] = {"concurrency": 1}
    principals["y"] = {"concurrency": 1, "maxAttempts": 5}
    controller = registry.register(
        make_profile(
            providers={"llm": {"concurrency": 1}, "other": {"concurrency": 10}},
            principals=principals,
        )
    )

    async def body():
        for name in names:
            (await controller.acquire(request(name, "other", budget=name))).release()
            controller.release_budget(name)
        # w waits for llm behind its own permit elsewhere: the floor of turns stays low.
        w_elsewhere = await controller.acquire(request("w", "other", budget="w1"))
        w_waiting = loop.create_task(controller.acquire(request("w", budget="w2")))
        await asyncio.sleep(0)
        # y keeps its budget, so it stays on the list of idle candidates, ahead of x.
        (await controller.acquire(request("y", "other", budget="y"))).release()
        (await controller.acquire(request("x", "other", budget="x"))).release()
        controller.release_budget("x")
        kept = "x" in controller._principals
        w_elsewhere.release()
        controller.release_budget("y")
        (await w_waiting).release()
        return kept

    try:
        assert loop.run_until_complete(body())
    finally:
        loop.close()


def test_a_controller_is_busy_while_any_lease_or_waiter_remains(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 2}})
    s = scenario_factory(profile)

    async def body(s):
        leases = [await s.admit(request(budget=f"l{n}")) for n in range(2)]
        waiters = [s.start(request(budget=f"w{n}")) for n in range(2)]
        await s.settle()
        waiters[0].cancel()
        await s.settle()
        assert s.controller.is_busy()  # one waiter is left
        waiters[1].cancel()
        await s.settle()
        assert s.controller.snapshot("alice") == (2, 0)
        leases.pop().release()
        assert s.controller.is_busy()  # one lease is left
        leases.pop().release()
        assert not s.controller.is_busy()

    s.run(body)


def test_retry_pressure_counts_at_most_the_window_cap(scenario_factory):
    s = scenario_factory()

    async def body(s):
        for _ in range(4100):
            s.controller.coordinate_retry_after("llm", 0)
        lease = await s.admit(request())
        lease.release()
        return lease.evidence.retry_pressure

    assert s.run(body) == 4096


def test_retry_pressure_forgets_an_event_exactly_a_minute_old(scenario_factory):
    s = scenario_factory()

    async def body(s):
        s.controller.coordinate_retry_after("llm", 0)
        await asyncio.sleep(59.999)
        before = await s.admit(request(budget="a"))
        before.release()
        await asyncio.sleep(0.001)
        at = await s.admit(request(budget="b"))
        at.release()
        return before.evidence.retry_pressure, at.evidence.retry_pressure

    assert s.run(body) == (1, 0)


def test_a_new_profile_re_arms_each_waiters_dwell_bound(scenario_factory):
    def version(label, wait):
        alice = {"concurrency": 1}
        if wait is not None:
            alice["maxQueueWaitMs"] = wait
        return make_profile(version=label, principals={"alice": alice})

    s = scenario_factory(version("v1", 5000))

    async def body(s):
        held = await s.admit(request(budget="h"))
        start = s.now()
        shorter = s.start(request(budget="a"))
        await asyncio.sleep(1)
        s.registry.register(version("v2", 2000))  # from arrival: 2 s
        await asyncio.sleep(0.999)
        assert not shorter.done()
        await asyncio.sleep(0.001)
        await s.settle()
        assert rejection_of(shorter).reason == "queue-timeout"
        assert s.now() - start == pytest.approx(2000)
        unbounded = s.start(request(budget="b"))
        await asyncio.sleep(1)
        s.registry.register(version("v3", None))  # no dwell bound any more
        await asyncio.sleep(10)
        assert not unbounded.done()
        held.release()
        await s.settle()
        assert unbounded.done() and unbounded.exception() is None
        unbounded.result().release()

    s.run(body)


def test_a_signal_firing_as_its_waiter_is_cancelled_still_moves_the_lane_on(scenario_factory):
    profile = make_profile(
        workspace={"concurrency": 100, "maxAttempts": 1},
        principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}},
    )
    s = scenario_factory(profile)

    async def body(s):
        held = await s.admit(request(budget="h"))
        signal = CancelSignal()
        head = s.start(request(budget="head", signal=signal))
        behind = s.start(request(budget="spent"))
        await s.settle()
        (await s.admit(request("bob", budget="spent"))).release()
        # The task is cancelled first; its signal fires before the task resumes.
        head.cancel()
        signal.cancel()
        await s.settle()
        assert head.cancelled()
        assert behind.done() and rejection_of(behind).reason == "attempts"
        held.release()

    s.run(body)


def test_releasing_a_budget_is_what_lets_a_principal_never_noted_idle_go():
    loop, registry = _bounded_registry(1)
    controller = registry.register(
        make_profile(principals={name: {"concurrency": 1, "maxAttempts": 3} for name in "ad"})
    )

    async def body():
        # Alone, a goes idle unnoticed: one principal is within the bound.
        (await controller.acquire(request("a", budget="inv-a"))).release()
        # d is noted idle when it releases, but keeps its budget.
        (await controller.acquire(request("d", budget="inv-d"))).release()
        assert set(controller._principals) == {"a", "d"}
        controller.release_budget("inv-a")
        return set(controller._principals)

    try:
        assert loop.run_until_complete(body()) == {"d"}
    finally:
        loop.close()


# ------------------------------------------------------------- reservations and event loops


def _reservations(label: str, pool: str):
    # Three permits in one pool (the workspace's or llm's); a and b each hold one back.
    pools = {"workspace": {"concurrency": 100}, "llm": {"concurrency": 100}}
    pools[pool] = {"concurrency": 3}
    return make_profile(
        version=label,
        workspace=pools["workspace"],
        providers={"llm": pools["llm"]},
        principals={
            "a": {"concurrency": 3, "reservedConcurrency": 1},
            "b": {"concurrency": 3, "reservedConcurrency": 1},
            "c": {"concurrency": 3},
        },
    )


@pytest.mark.parametrize("pool", ["workspace", "llm"])
def test_a_new_profile_recounts_the_reservations_in_use(scenario_factory, pool):
    s = scenario_factory(_reservations("v1", pool))

    async def body(s):
        used = await s.admit(request("b", budget="b1"))
        s.registry.register(_reservations("v2", pool))
        # b uses its reservation, a's is held back: of three permits one is free for c.
        first = await asyncio.wait_for(s.admit(request("c", budget="c1")), 0.001)
        second = s.start(request("c", budget="c2"))
        await s.settle()
        assert not second.done()
        used.release()  # b's reservation is back, held back again
        await s.settle()
        assert not second.done()
        first.release()
        await s.settle()
        assert second.done() and second.exception() is None
        second.result().release()

    s.run(body)


def test_integral_float_figures_count_as_integers(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 1, "maxBatchSize": 2}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request(batch_size=2.0, request_bytes=10.0, items=3.0))
        lease.release()
        assert (await s.reject(request(budget="b", batch_size=3.0))).reason == "batch-size"

    s.run(body)


def test_a_controller_follows_a_new_loop_only_without_waiters_on_a_running_one():
    first = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=first.clock)
    controller = registry.register(make_profile(principals={"alice": {"concurrency": 1}}))

    async def on_first():
        held = await controller.acquire(request(budget="h"))
        waiter = asyncio.get_running_loop().create_task(controller.acquire(request(budget="w")))
        await asyncio.sleep(0)
        return held, waiter

    held, waiter = first.run_until_complete(on_first())
    second = VirtualTimeLoop()
    try:
        with pytest.raises(RuntimeError) as caught:
            second.run_until_complete(controller.acquire(request(budget="x")))
        assert str(caught.value) == "this controller has waiters on another running event loop"
        assert controller.snapshot("alice") == (1, 1)
        waiter.cancel()
        first.run_until_complete(asyncio.gather(waiter, return_exceptions=True))
        # No waiter left: the controller follows the other loop while the first stays open.
        held.release()
        lease = second.run_until_complete(controller.acquire(request(budget="y")))
        assert controller.snapshot("alice") == (1, 0)
        lease.release()
    finally:
        second.close()
        first.close()


def test_waiters_of_a_closed_loop_are_dropped_when_the_controller_moves_on():
    first = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=first.clock)
    controller = registry.register(make_profile(principals={"alice": {"concurrency": 2}}))

    async def on_first():
        held = [await controller.acquire(request(budget=f"h{n}")) for n in range(2)]
        waiter = asyncio.get_running_loop().create_task(controller.acquire(request(budget="w")))
        await asyncio.sleep(0)
        return held, waiter

    held, _waiter = first.run_until_complete(on_first())
    first.close()
    second = VirtualTimeLoop()

    async def on_second():
        task = asyncio.get_running_loop().create_task(controller.acquire(request(budget="x")))
        await asyncio.sleep(0)
        # The first loop's waiter is gone; this one waits in its place.
        assert controller.snapshot("alice") == (2, 1)
        held.pop().release()
        lease = await task
        assert controller.snapshot("alice") == (2, 0)
        lease.release()
        held.pop().release()

    try:
        second.run_until_complete(on_second())
    finally:
        second.close()


@pytest.mark.parametrize("ahead_ms, refused", [(50, False), (51, True)])
def test_a_loop_whose_clock_is_too_far_from_the_registrys_is_refused(ahead_ms, refused):
    first = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=first.clock)
    controller = registry.register(make_profile())
    first.run_until_complete(asyncio.sleep(ahead_ms / 1000))
    second = VirtualTimeLoop()
    try:
        if refused:
            with pytest.raises(RuntimeError) as caught:
                second.run_until_complete(controller.acquire(request()))
            assert str(caught.value) == (
                "the running event loop's clock disagrees with this registry's clock by "
                f"{ahead_ms} ms; one registry has one clock, the clock of its loop"
            )
        else:
            second.run_until_complete(controller.acquire(request())).release()
    finally:
        second.close()
        first.close()


def test_a_controller_whose_last_waiter_is_cancelled_is_noted_idle():
    loop, registry = _bounded_registry(1)
    first = registry.register(make_profile())
    other = registry.register(Profile.from_dict(profile_doc(), workspace_id="ws-2"))

    async def body():
        first.coordinate_retry_after("llm", 100)
        waiter = loop.create_task(first.acquire(request(budget="w")))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert not first.is_busy() and not first.evicted
        await asyncio.sleep(0.2)  # the pause is over: nothing of first's state matters now
        (await other.acquire(request(budget="x", workspace="ws-2"))).release()
        return first.evicted, other.evicted

    try:
        # first was noted idle when its waiter left, before other: it goes first.
        assert loop.run_until_complete(body()) == (True, False)
    finally:
        loop.close()
