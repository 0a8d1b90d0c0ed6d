"""Edges of the controller's bookkeeping that a single admission does not show.

Each test pins one count the controller keeps between decisions (breaker failures and probes,
reservations held back in a pool, reconciled budgets, a token reservation) at the boundary where
an off-by-one would let one call too many through or hold one back.
"""

from __future__ import annotations

import asyncio

import pytest

from admission.core import AdmissionRegistry, QueueSnapshot, VirtualTimeLoop

from .conftest import make_profile, request


def _breaker(threshold: int, half_open_max_calls: int = 1) -> dict:
    return {
        "failureThreshold": threshold,
        "openMs": 1000,
        "halfOpenMaxCalls": half_open_max_calls,
    }


def test_breaker_transitions_record_the_consecutive_failures_that_caused_them(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 10, "circuitBreaker": _breaker(3)}})
    s = scenario_factory(profile)

    async def body(s):
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release(success=False)
        assert s.controller.breaker_transitions() == []  # two of three
        (await s.admit(request(budget="c"))).release(success=False)
        probe = await s.admit(request(budget="d"))  # waits out openMs, then probes
        probe.release(success=False)  # a failed probe opens it again
        probe = await s.admit(request(budget="e"))
        probe.release(success=True)
        # Closed again, the count starts over: three more failures to open.
        for budget in ("f", "g"):
            (await s.admit(request(budget=budget))).release(success=False)
        assert s.controller.breaker_transitions()[-1].to_state == "closed"
        (await s.admit(request(budget="h"))).release(success=False)
        return [(t.from_state, t.to_state, t.failures) for t in s.controller.breaker_transitions()]

    assert s.run(body) == [
        ("closed", "open", 3),
        ("open", "half-open", 3),
        ("half-open", "open", 4),
        ("open", "half-open", 4),
        ("half-open", "closed", 0),
        ("closed", "open", 3),
    ]


def test_an_older_generations_release_does_not_free_a_probe_slot(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 10, "circuitBreaker": _breaker(2)}})
    s = scenario_factory(profile)

    async def body(s):
        before = await s.admit(request(budget="old"))  # admitted while closed
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release(success=False)
        probe = await s.admit(request(budget="probe"))
        assert probe.evidence.breaker_state == "half-open"
        waiting = s.start(request(budget="next"))
        await s.settle()
        assert not waiting.done()
        # A lease of the closed generation ends: no outcome of the probe yet, so no second probe.
        before.release(success=None)
        await asyncio.sleep(0.5)
        assert not waiting.done()
        probe.release(success=True)
        await s.settle()
        assert waiting.done() and waiting.exception() is None
        waiting.result().release()

    s.run(body)


def test_a_probe_released_without_outcome_frees_exactly_one_probe_slot(scenario_factory):
    profile = make_profile(providers={"llm": {"concurrency": 10, "circuitBreaker": _breaker(2, 2)}})
    s = scenario_factory(profile)

    async def body(s):
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release(success=False)
        first = await s.admit(request(budget="p1"))
        second = await s.admit(request(budget="p2"))
        third = s.start(request(budget="p3"))
        fourth = s.start(request(budget="p4"))
        await s.settle()
        assert not third.done() and not fourth.done()
        first.release(success=None)
        await s.settle()
        assert third.done() and third.exception() is None
        assert third.result().evidence.breaker_state == "half-open"
        assert not fourth.done()  # two probes in flight again: second and third
        second.release(success=True)
        await s.settle()
        assert fourth.done()
        for task in (third, fourth):
            task.result().release()

    s.run(body)


def _reserved_profile():
    # One provider pool of three permits; `a` and `b` each hold one back for themselves.
    return make_profile(
        workspace={"concurrency": 100},
        providers={"llm": {"concurrency": 3}},
        principals={
            "a": {"concurrency": 3, "reservedConcurrency": 1},
            "b": {"concurrency": 3, "reservedConcurrency": 1},
            "c": {"concurrency": 3},
        },
    )


def test_a_principal_above_its_reservation_does_not_spend_anothers(scenario_factory):
    s = scenario_factory(_reserved_profile())

    async def body(s):
        held = [await s.admit(request("a", budget=f"a{n}")) for n in range(2)]
        # One permit left in the pool, and it is b's reservation: c waits.
        blocked = s.start(request("c", budget="c1"))
        await s.settle()
        assert not blocked.done()
        reserved = await s.admit(request("b", budget="b1"))
        for lease in (*held, reserved):
            lease.release()
        await s.settle()
        assert blocked.done() and blocked.exception() is None
        blocked.result().release()

    s.run(body)


def test_a_release_above_the_reservation_gives_the_pool_its_permit_back(scenario_factory):
    s = scenario_factory(_reserved_profile())

    async def body(s):
        held = [await s.admit(request("a", budget=f"a{n}")) for n in range(2)]
        # The pool's three permits: two held by a, one held back for b; c has to wait.
        waiting = s.start(request("c", budget="c1"))
        await s.settle()
        assert not waiting.done()
        assert s.controller.snapshot("c") == QueueSnapshot(active=0, queued=1)
        held.pop().release()
        await s.settle()
        # a still uses its reservation; b's is held back; the permit a gave back goes to c.
        assert waiting.done() and waiting.exception() is None
        assert s.controller.snapshot("a") == QueueSnapshot(active=1, queued=0)
        assert s.controller.snapshot("c") == QueueSnapshot(active=1, queued=0)
        waiting.result().release()
        held.pop().release()
        assert s.controller.snapshot("a") == QueueSnapshot(active=0, queued=0)

    s.run(body)


def test_reservations_return_one_by_one(scenario_factory):
    s = scenario_factory(_reserved_profile())

    async def body(s):
        a = await s.admit(request("a", budget="a1"))
        b = await s.admit(request("b", budget="b1"))
        a.release()
        b.release()
        # Both reservations are unused again: of three permits c may take one, not two.
        c1 = await s.admit(request("c", budget="c1"))
        c2 = s.start(request("c", budget="c2"))
        await s.settle()
        assert not c2.done()
        c1.release()
        await s.settle()
        assert c2.done()
        c2.result().release()

    s.run(body)


def test_an_actual_cost_is_charged_in_full_when_the_estimate_said_zero(scenario_factory):
    profile = make_profile(principals={"alice": {"concurrency": 4, "maxCostUsd": 1.0}})
    s = scenario_factory(profile)

    async def body(s):
        lease = await s.admit(request(budget="inv", cost_usd=0.0))
        lease.release(success=True, actual_cost_usd=0.6)
        return await s.reject(request(budget="inv", cost_usd=0.5))

    assert s.run(body).reason == "cost"


def test_a_request_behind_a_token_reservation_needs_its_own_tokens_too(scenario_factory):
    # 1000 tokens a second in the workspace; the bucket starts full and holds 1000.
    profile = make_profile(
        workspace={"concurrency": 100, "tokensPerSecond": 1000},
        providers={"llm": {"concurrency": 10}, "other": {"concurrency": 1}},
        principals={p: {"concurrency": 4} for p in ("big", "small", "w")},
    )
    s = scenario_factory(profile)

    async def body(s):
        # A lane waiting elsewhere keeps the rotation's floor low, so that `small`, never served,
        # takes its turn before `big`, served just now.
        elsewhere = await s.admit(request("w", "other", budget="w1"))
        waiting_elsewhere = s.start(request("w", "other", budget="w2"))
        await s.settle()
        (await s.admit(request("big", budget="drain", tokens=1000))).release()
        start = s.now()
        holder = s.start(request("big", budget="held", tokens=300))
        await s.settle()
        behind = s.start(request("small", budget="behind", tokens=800))
        await s.settle()
        lease = await holder
        held_at = s.now() - start
        lease.release()
        later = await behind
        behind_at = s.now() - start
        later.release()
        elsewhere.release()
        (await waiting_elsewhere).release()
        return held_at, behind_at

    held_at, behind_at = s.run(body)
    # The holder gets its 300 first; the one behind then waits for its own 800 as well.
    assert held_at == pytest.approx(300)
    assert behind_at == pytest.approx(1100)


def test_a_wake_passed_on_in_the_next_pump_reaches_a_lane_parked_in_an_earlier_one(
    scenario_factory,
):
    profile = make_profile(
        providers={"llm": {"concurrency": 1}, "other": {"concurrency": 1}},
        principals={
            "a": {"concurrency": 1},
            "b": {"concurrency": 1},
            "x": {"concurrency": 1},
            "y": {"concurrency": 1},
        },
    )
    s = scenario_factory(profile)

    async def body(s):
        # A first pump: y queues behind x and is admitted when x releases.
        first = await s.admit(request("x", budget="x1"))
        queued = s.start(request("y", budget="y1"))
        await s.settle()
        first.release()
        holder = await queued
        # a and b park on the full provider, a first.
        a_task = s.start(request("a", budget="a1"))
        b_task = s.start(request("b", budget="b1"))
        await s.settle()
        # a now holds its only permit elsewhere, so when woken it cannot take llm's permit...
        a_elsewhere = await s.admit(request("a", "other", budget="a2"))
        holder.release()
        await s.settle()
        # ...and passes the wake on to b, parked before this pump began.
        assert not a_task.done()
        assert b_task.done() and b_task.exception() is None
        b_task.result().release()
        a_elsewhere.release()
        (await a_task).release()

    s.run(body)


def test_a_lane_returning_after_its_turn_still_ranks_by_when_it_was_last_served(
    scenario_factory,
):
    # llm takes one call at a time; w can hold only one permit at all.
    profile = make_profile(
        providers={"llm": {"concurrency": 1}, "other": {"concurrency": 10}},
        principals={p: {"concurrency": 4} for p in ("x", "d")} | {"w": {"concurrency": 1}},
    )
    s = scenario_factory(profile)

    async def body(s):
        # w waits for llm behind its own permit elsewhere, for the whole test: the oldest waiter.
        w_elsewhere = await s.admit(request("w", "other", budget="w1"))
        w_waiting = s.start(request("w", budget="w2"))
        await s.settle()
        x_first = await s.admit(request("x", budget="x1"))
        d_tasks = [s.start(request("d", budget=f"d{n}")) for n in range(2)]
        await s.settle()
        x_first.release()
        await s.settle()
        d_first = d_tasks[0].result()
        # x comes back after d was served: x was served before d, so x goes before d's next.
        x_again = s.start(request("x", budget="x2"))
        await s.settle()
        d_first.release()
        await s.settle()
        order = [name for name, task in (("x", x_again), ("d", d_tasks[1])) if task.done()]
        first, second = (x_again, d_tasks[1]) if x_again.done() else (d_tasks[1], x_again)
        first.result().release()
        await s.settle()
        second.result().release()
        w_elsewhere.release()
        (await w_waiting).release()
        return order

    assert s.run(body) == ["x"]


def test_principals_without_budgets_are_forgotten_once_idle_beyond_the_bound():
    # Memory stays bounded by max_idle_scopes even for principals that keep no budgets (their
    # only chance to be noted idle is the release of their last permit).
    names = [f"p{n}" for n in range(40)]
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock, max_idle_scopes=2)
    controller = registry.register(
        make_profile(principals={name: {"concurrency": 1} for name in names})
    )

    async def body():
        for name in names:
            lease = await controller.acquire(request(name, budget=f"inv-{name}"))
            lease.release(success=True)
            controller.release_budget(f"inv-{name}")
        return len(controller._principals)

    try:
        # The first two went idle before there was a crowd, so they were never noted idle; of
        # the thirty-eight after them, no more than the bound is kept.
        assert loop.run_until_complete(body()) <= 2 + 2
    finally:
        loop.close()


def test_a_release_after_the_waiters_loop_closed_frees_the_permit_for_good():
    first = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=first.clock)
    controller = registry.register(make_profile(principals={"alice": {"concurrency": 1}}))

    async def on_first():
        held = await controller.acquire(request(budget="held"))
        waiter = asyncio.get_running_loop().create_task(controller.acquire(request(budget="w")))
        await asyncio.sleep(0)
        return held, waiter

    held, _waiter = first.run_until_complete(on_first())
    first.close()
    # Its waiter can never be resumed, so it is dropped instead of being handed the permit.
    held.release()
    assert controller.snapshot("alice") == (0, 0)
    assert not controller.is_busy()
    second = VirtualTimeLoop()
    try:
        lease = second.run_until_complete(controller.acquire(request(budget="next")))
        lease.release()
    finally:
        second.close()
