"""Idle state is forgotten, and only idle state: what still decides an admission survives eviction.

A registry keeps at most `max_idle_scopes` idle controllers (a controller as many idle principal
scopes) and drops the idle ones beyond that; a host then gets a fresh controller for the
workspace. A scope whose Retry-After pause, breaker, request bucket or open invocation budget
would still change an outcome is not idle and must be kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from admission.core import AdmissionRegistry, AdmissionRejected, VirtualTimeLoop

from .conftest import WORKSPACE, make_profile, request

Body = Callable[[AdmissionRegistry], Awaitable[Any]]


def _run(body: Body, *, max_idle_scopes: int = 0) -> Any:
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock, max_idle_scopes=max_idle_scopes)
    registry.register(
        make_profile(
            providers={
                "llm": {
                    "concurrency": 4,
                    "circuitBreaker": {"failureThreshold": 3, "openMs": 5000},
                },
                # One request a minute: a bucket of one that refills in 60 s.
                "paced": {"concurrency": 4, "requestsPerMinute": 1},
            },
            principals={
                "alice": {"concurrency": 4, "maxAttempts": 2},
                "bob": {"concurrency": 4},
                "carol": {"concurrency": 4},
            },
        )
    )
    try:
        return loop.run_until_complete(body(registry))
    finally:
        loop.close()


async def _call(
    registry: AdmissionRegistry,
    principal: str = "alice",
    budget: str = "inv",
    provider: str = "llm",
    **outcome: Any,
) -> float:
    """One whole invocation as a host runs it; returns how long admission took (ms)."""
    controller = registry.controller(WORKSPACE)
    assert controller is not None
    start = registry.clock.monotonic_ms()
    lease = await controller.acquire(request(principal, provider, budget))
    waited = registry.clock.monotonic_ms() - start
    lease.release(**outcome)
    controller.release_budget(budget)
    return waited


def _kept(registry: AdmissionRegistry, before: Any) -> bool:
    return registry.controller(WORKSPACE) is before


def test_a_clean_idle_controller_is_dropped():
    async def body(registry):
        first = registry.controller(WORKSPACE)
        await _call(registry, success=True)
        # A closed breaker without failures and full buckets: nothing of it needs keeping.
        return first.evicted, _kept(registry, first)

    assert _run(body) == (True, False)


def test_a_retry_after_pause_outlives_eviction_until_it_has_ended():
    async def body(registry):
        first = registry.controller(WORKSPACE)
        await _call(registry, budget="a", retry_after_ms=1000)
        kept = _kept(registry, first)
        # The pause still holds: the next call waits for it rather than being admitted at once.
        waited = await _call(registry, budget="b")
        # Now the pause has ended (exactly at this instant): the controller is idle, dropped.
        return kept, waited, first.evicted

    assert _run(body) == (True, 1000.0, True)


def test_breaker_failures_outlive_eviction_so_the_breaker_opens_at_its_threshold():
    async def body(registry):
        await _call(registry, budget="f1", success=False)
        await _call(registry, budget="f2", success=False)
        await _call(registry, budget="f3", success=False)
        controller = registry.controller(WORKSPACE)
        return [t.to_state for t in controller.breaker_transitions()]

    assert _run(body) == ["open"]


def test_an_open_breaker_outlives_eviction():
    async def body(registry):
        for budget in ("f1", "f2", "f3"):
            await _call(registry, budget=budget, success=False)
        # Open, its failures counted: the next call waits for the breaker's 5 s.
        return await _call(registry, budget="next", success=True)

    assert _run(body) == 5000.0


def test_a_drained_request_bucket_outlives_eviction_until_it_has_refilled():
    async def body(registry):
        first = registry.controller(WORKSPACE)
        waits = [await _call(registry, budget="a", provider="paced")]
        kept = _kept(registry, first)
        # The bucket is empty: the next request waits the whole refill.
        waits.append(await _call(registry, budget="b", provider="paced"))
        await asyncio.sleep(60)
        # Full again: the next idle moment drops the controller.
        await _call(registry, budget="c", success=True)
        return waits, kept, first.evicted

    assert _run(body) == ([0.0, 60_000.0], True, True)


def test_a_principal_with_an_open_budget_is_kept_among_idle_principals():
    async def body(registry):
        # Only one principal scope may idle; bob and carol come and go around alice, whose
        # invocation "inv" (two attempts at most) stays open between its attempts.
        await _call(registry, "bob", "b0")
        controller = registry.controller(WORKSPACE)
        (await controller.acquire(request("alice", budget="inv"))).release()
        for i, principal in enumerate(("carol", "bob", "carol", "bob")):
            await _call(registry, principal, f"o{i}")
        (await controller.acquire(request("alice", budget="inv"))).release()
        try:
            await controller.acquire(request("alice", budget="inv"))
        except AdmissionRejected as error:
            return error.reason
        return "a third attempt was admitted"

    assert _run(body, max_idle_scopes=1) == "attempts"
