"""CNC-ADMIT-015..017 and CNC-ADMIT-BREAKER-001: Retry-After pauses and the circuit breaker."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import make_profile, request

BREAKER = {"failureThreshold": 2, "openMs": 1000, "halfOpenMaxCalls": 1}


def breaker_profile(**extra):
    return make_profile(providers={"llm": {"concurrency": 10, "circuitBreaker": BREAKER, **extra}})


def test_CNC_ADMIT_015_retry_after_pauses_the_provider_lane(scenario_factory):
    s = scenario_factory(breaker_profile())

    async def body(s):
        lease = await s.admit(request(budget="a"))
        start = s.now()
        lease.release(success=False, retry_after_ms=500)
        # A Retry-After is not a breaker failure.
        s.controller.coordinate_retry_after("llm", 200)  # never shortens the pause
        waiting = await s.admit(request(budget="b"))
        assert s.now() - start == pytest.approx(500)
        assert waiting.evidence.breaker_state == "closed"
        assert waiting.evidence.retry_pressure == 2
        waiting.release(success=False, retry_after_ms=100)
        s.controller.coordinate_retry_after("llm", 800)  # extends
        start = s.now()
        (await s.admit(request(budget="c"))).release()
        assert s.now() - start == pytest.approx(800)
        assert s.controller.breaker_transitions() == []
        with pytest.raises(ValueError):
            s.controller.coordinate_retry_after("llm", -1)
        with pytest.raises(ValueError):
            s.controller.coordinate_retry_after("nowhere", 10)

    s.run(body)


def test_CNC_ADMIT_016_breaker_opens_half_opens_and_closes(scenario_factory):
    s = scenario_factory(breaker_profile())

    async def body(s):
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release(success=False)
        transitions = s.controller.breaker_transitions()
        assert [(t.from_state, t.to_state) for t in transitions] == [("closed", "open")]
        opened = s.now()
        probe = await s.admit(request(budget="c"))
        # Open turns half-open lazily, at the first admission check after openMs.
        assert s.now() - opened == pytest.approx(1000)
        assert probe.evidence.breaker_state == "half-open"
        assert [t.to_state for t in probe.evidence.breaker_transitions] == ["half-open"]
        second = s.start(request(budget="d"))
        await asyncio.sleep(5)
        assert not second.done()  # only one probe in flight
        probe.release(success=False)  # a failed probe reopens
        assert [t.to_state for t in probe.evidence.breaker_transitions] == ["half-open", "open"]
        reopened = s.now()
        await s.settle()
        assert not second.done()
        lease = await second
        assert s.now() - reopened == pytest.approx(1000)
        lease.release(success=True)
        assert lease.evidence.breaker_transitions[-1].to_state == "closed"
        (await s.admit(request(budget="e"))).release(success=True)
        states = [(t.from_state, t.to_state) for t in s.controller.breaker_transitions()]
        assert states == [
            ("closed", "open"),
            ("open", "half-open"),
            ("half-open", "open"),
            ("open", "half-open"),
            ("half-open", "closed"),
        ]

    s.run(body)


def test_CNC_ADMIT_017_stale_outcomes_and_no_outcome_do_not_move_the_breaker(scenario_factory):
    s = scenario_factory(breaker_profile())

    async def body(s):
        early = await s.admit(request(budget="early"))
        for budget in ("a", "b"):
            (await s.admit(request(budget=budget))).release(success=False)
        assert s.controller.breaker_transitions()[-1].to_state == "open"
        # A success from a lease admitted before the breaker opened must not close it.
        early.release(success=True)
        assert s.controller.breaker_transitions()[-1].to_state == "open"
        probe = await s.admit(request(budget="c"))
        assert probe.evidence.breaker_state == "half-open"
        probe.release(success=None)  # cancelled by the caller: no outcome
        assert s.controller.breaker_transitions()[-1].to_state == "half-open"
        # Caller cancellations never count as failures on a closed breaker either.
        probe = await s.admit(request(budget="d"))
        probe.release(success=True)
        for i in range(5):
            (await s.admit(request(budget=f"n{i}"))).release(success=None)
        assert s.controller.breaker_transitions()[-1].to_state == "closed"
        # Release is idempotent: a second call changes nothing.
        lease = await s.admit(request(budget="x"))
        lease.release(success=False)
        lease.release(success=False)
        assert s.controller.breaker_transitions()[-1].to_state == "closed"
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_BREAKER_001_transitions_reach_evidence_history_and_listeners(scenario_factory):
    s = scenario_factory(breaker_profile())
    seen = []
    s.registry.on_breaker_transition(lambda t: 1 / 0)  # a failing listener breaks nothing
    unsubscribe = s.registry.on_breaker_transition(seen.append)

    async def body(s):
        (await s.admit(request(budget="a"))).release(success=False)
        lease = await s.admit(request(budget="b"))
        lease.release(success=False)
        [transition] = lease.evidence.breaker_transitions
        assert transition.to_dict() == {
            "providerId": "llm",
            "from": "closed",
            "to": "open",
            "atEpochMs": s.loop.clock.epoch_ms(),
            "failures": 2,
        }
        assert lease.evidence.to_dict()["breakerTransitions"] == [transition.to_dict()]
        assert seen == [transition]
        unsubscribe()
        await asyncio.sleep(1)
        (await s.admit(request(budget="c"))).release(success=True)
        assert len(seen) == 1
        assert len(s.controller.breaker_transitions()) == 3

    s.run(body)


def test_CNC_ADMIT_BREAKER_001_history_is_bounded(scenario_factory):
    s = scenario_factory(
        make_profile(
            providers={
                "llm": {
                    "concurrency": 10,
                    "circuitBreaker": {"failureThreshold": 1, "openMs": 1, "halfOpenMaxCalls": 1},
                }
            }
        )
    )

    async def body(s):
        for i in range(400):
            (await s.admit(request(budget=f"b{i}"))).release(success=False)
        assert len(s.controller.breaker_transitions()) == 256

    s.run(body)


def test_a_profile_without_the_breaker_stops_an_open_breaker_from_deferring(scenario_factory):
    def profile(version, breaker):
        llm = {"concurrency": 5, **({"circuitBreaker": breaker} if breaker else {})}
        return make_profile(version=version, providers={"llm": llm})

    s = scenario_factory(profile("guarded", {"failureThreshold": 1, "openMs": 60_000}))

    async def body(s):
        (await s.admit(request(budget="f"))).release(success=False)
        s.registry.register(profile("unguarded", None))
        start = s.now()
        lease = await s.admit(request(budget="after"))
        lease.release(success=True)
        return s.now() - start

    assert s.run(body) == 0


def test_a_half_open_breaker_with_its_probes_out_defers_with_circuit_open(scenario_factory):
    breaker = {"failureThreshold": 1, "openMs": 100, "halfOpenMaxCalls": 1}
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 5, "circuitBreaker": breaker}})
    )
    decisions: list[tuple[str, str]] = []
    s.registry.on_decision(lambda event: decisions.append((event.decision, event.reason)))

    async def body(s):
        (await s.admit(request(budget="f"))).release(success=False)
        await asyncio.sleep(0.1)
        decisions.clear()
        probe = await s.admit(request(budget="probe"))
        waiting = s.start(request(budget="w"))
        await s.settle()
        probe.release(success=True)
        (await waiting).release(success=True)

    s.run(body)
    assert decisions == [("admit", "admitted"), ("defer", "circuit-open"), ("admit", "admitted")]


def test_a_success_resets_the_count_of_consecutive_failures(scenario_factory):
    breaker = {"failureThreshold": 3, "openMs": 1000}
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 5, "circuitBreaker": breaker}})
    )

    async def body(s):
        for i, success in enumerate([False, False, True, False, False]):
            (await s.admit(request(budget=f"c{i}"))).release(success=success)
        return s.controller.breaker_transitions()

    # Never three failures in a row: the breaker stays closed.
    assert s.run(body) == []


def test_closing_the_breaker_wakes_every_lane_waiting_on_the_provider(scenario_factory):
    breaker = {"failureThreshold": 1, "openMs": 100, "halfOpenMaxCalls": 1}
    s = scenario_factory(
        make_profile(
            providers={"llm": {"concurrency": 5, "circuitBreaker": breaker}},
            principals={p: {"concurrency": 5} for p in ("alice", "bob", "carol")},
        )
    )

    async def body(s):
        (await s.admit(request(budget="f"))).release(success=False)
        await asyncio.sleep(0.1)
        probe = await s.admit(request("alice", budget="probe"))
        waiting = [s.start(request(p, budget=f"w-{p}")) for p in ("alice", "bob", "carol")]
        await s.settle()
        probe.release(success=True)
        await s.settle()
        admitted = [task.done() for task in waiting]
        for task in waiting:
            (await task).release(success=True)
        return admitted

    assert s.run(body) == [True, True, True]


def test_a_half_open_breaker_admits_exactly_its_probe_calls(scenario_factory):
    breaker = {"failureThreshold": 1, "openMs": 100, "halfOpenMaxCalls": 2}
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 5, "circuitBreaker": breaker}})
    )

    async def body(s):
        (await s.admit(request(budget="f"))).release(success=False)
        await asyncio.sleep(0.1)
        calls = [s.start(request(budget=f"p{i}")) for i in range(3)]
        await s.settle()
        admitted = [task.done() for task in calls]
        for task in calls[:2]:
            (await task).release(success=None)
        calls[2].cancel()
        return admitted

    assert s.run(body) == [True, True, False]


def test_an_admission_is_reported_with_its_evidence(scenario_factory):
    s = scenario_factory()
    events = []
    s.registry.on_decision(events.append)

    async def body(s):
        lease = await s.admit(request(budget="a"))
        lease.release()
        return lease.evidence

    evidence = s.run(body)
    assert (evidence.decision, evidence.reason) == ("admit", "admitted")
    assert [(e.decision, e.reason, e.evidence) for e in events] == [("admit", "admitted", evidence)]
