"""The core's shadow: dry-run decisions beside real ones, held as long as the real lease,
released with the real outcome, withdrawn with the real request, and counted alike."""

from __future__ import annotations

import asyncio

from admission.core import AdmissionRejected

from .conftest import make_profile, request

BREAKER = {"concurrency": 100, "circuitBreaker": {"failureThreshold": 1, "openMs": 60_000}}


def test_a_real_failure_opens_the_shadows_breaker_and_nothing_real(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2", providers={"llm": BREAKER}))

    async def body(s):
        first = request(budget="a")
        call = shadow.mirror(first)
        lease = await s.admit(first)
        call.admitted(lease)
        await asyncio.sleep(0.05)
        lease.release(success=False)
        call.released(lease, success=False)
        await s.settle()
        second = request(budget="b", deadline_ms=s.now() + 1_000)
        call = shadow.mirror(second)
        lease = await s.admit(second)
        call.admitted(lease)
        await s.settle()
        lease.release(success=True)
        call.released(lease, success=True)
        # The copy waits for the open breaker until its deadline.
        await asyncio.sleep(2.0)

    scenario.run(body)
    active, would_be = shadow.drain()
    assert active["admitted"] == 2 and active["breakerTransitions"] == {}
    # The shadow's breaker opened on the failure its copy was released with...
    assert would_be["breakerTransitions"] == {"closed->open": 1}
    # ...so the next request, which reality admitted, waited for it until its deadline.
    assert would_be["admitted"] == 1 and would_be["rejected"] == {"deadline-exceeded": 1}
    assert would_be["deferred"] == 1 and would_be["queueDelayMs"]["max"] == 1000.0
    assert not shadow.calls


def test_a_shadow_permit_is_held_as_long_as_the_real_one_from_its_own_admission(
    scenario_factory,
):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", workspace={"concurrency": 1}), session="s"
    )
    held: dict[str, float] = {}

    async def body(s):
        calls, leases = [], []
        for budget in ("a", "b"):
            req = request(budget=budget)
            calls.append(shadow.mirror(req))
            leases.append(await s.admit(req))
            calls[-1].admitted(leases[-1])
        await s.settle()
        # Reality ran both at once for 100 ms; the shadow had one permit.
        await asyncio.sleep(0.1)
        for call, lease in zip(calls, leases, strict=True):
            lease.release(success=True)
            call.released(lease, success=True)
        start = s.now()
        while shadow.calls:
            await asyncio.sleep(0.001)
        held["ms"] = s.now() - start

    scenario.run(body)
    _active, would_be = shadow.drain()
    assert would_be["admitted"] == 2 and would_be["deferred"] == 1
    # The second copy waited the first one's 100 ms, then held its own permit for 100 ms.
    assert would_be["queueDelayMs"]["max"] == 100.0
    assert 99.0 <= held["ms"] <= 102.0


def test_a_withdrawn_request_withdraws_its_copy_and_stop_withdraws_the_rest(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", workspace={"concurrency": 1})
    )

    async def body(s):
        first, second, third = (request(budget=b) for b in "abc")
        calls = [shadow.mirror(r) for r in (first, second, third)]
        lease = await s.admit(first)
        calls[0].admitted(lease)
        await s.settle()
        assert len(shadow.calls) == 3
        # The second request gave up in reality before its decision: its copy goes too.
        calls[1].abandoned()
        await s.settle()
        assert len(shadow.calls) == 2
        scenario.registry.stop_shadow(first.workspace_id)
        await s.settle()
        assert shadow.mirror(request(budget="d")) is None
        lease.release(success=True)
        calls[0].released(lease, success=True)
        await s.settle()

    scenario.run(body)
    assert not shadow.calls
    assert scenario.registry.shadow("ws-1") is None


def test_a_shadow_never_raises_into_the_real_path(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2", providers={}))

    async def body(s):
        req = request()
        call = shadow.mirror(req)
        lease = await s.admit(req)
        call.admitted(lease)
        await s.settle()
        lease.release(success=True)
        call.released(lease, success=True)

    scenario.run(body)
    _active, would_be = shadow.drain()
    # The shadow's profile has no such provider: its would-be outcome is a refusal.
    assert would_be["rejected"] == {"unconfigured-provider": 1}
    assert issubclass(AdmissionRejected, Exception)


def test_a_shadow_stopped_from_another_thread_withdraws_on_its_loop(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", workspace={"concurrency": 1})
    )

    async def body(s):
        requests = [request(budget=b) for b in "ab"]
        calls = [shadow.mirror(r) for r in requests]
        leases = [await s.admit(r) for r in requests]
        for call, lease in zip(calls, leases, strict=True):
            call.admitted(lease)
        await s.settle()
        assert len(shadow.calls) == 2  # one copy holds the shadow permit, one waits for it
        # A host thread stops the shadow (as a worker's profile refresh does).
        await asyncio.get_running_loop().run_in_executor(None, s.registry.stop_shadow, "ws-1")
        await s.settle()
        # The waiting copy is withdrawn and the held shadow permit given back.
        assert not shadow.calls
        assert shadow.controller.snapshot("alice") == (0, 0)
        for call, lease in zip(calls, leases, strict=True):
            lease.release(success=True)
            call.released(lease, success=True)
        await s.settle()

    scenario.run(body)
    assert not shadow.calls
