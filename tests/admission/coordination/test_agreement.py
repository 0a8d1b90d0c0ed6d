"""The rules are one copy: the Redis functions and the in-process controller agree.

On generated profiles and request sequences, a coordinated controller (its checks decided by the
Lua functions in a real Redis) and the in-process controller of `admission.core` see the same
requests one at a time and must reach the same decision with the same reason, and leave the same
capacity behind: permits in use per scope, whole requests left in each request bucket, breaker
state. A request that would wait is seen deferred (with its reason) and then cancelled, on both
sides, so every step ends in a known state.

Token buckets are left out here: one refills a whole token within milliseconds, and the two
sides read their clocks a few milliseconds apart, so a decision on the edge could differ by time
alone (the state machines and the checks cover them). Request buckets are kept slow enough
(at most two per minute) that no generated run lasts long enough for time to matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    AdmissionRequest,
    CancelSignal,
    Estimate,
    Profile,
)
from admission.core.errors import InvalidProfileError
from tests.admission.coordination.conftest import SHARED_REDIS, WORKSPACE, Deployment, _reachable

PRINCIPALS = ("alice", "bob", "carol")
PROVIDERS = ("llm", "alt")
BUDGETS = ("inv-1", "inv-2")

pytestmark = pytest.mark.skipif(
    not _reachable(SHARED_REDIS), reason=f"the agreement test needs Redis at {SHARED_REDIS}"
)


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def scope_limits(draw: st.DrawFn, *, pool: bool) -> dict[str, Any]:
    limits: dict[str, Any] = {"concurrency": draw(st.integers(1, 4 if pool else 3))}
    optional = {
        "requestsPerMinute": _optional(st.integers(1, 2)),
        "maxQueueLength": _optional(st.integers(0, 2)),
    }
    if pool:
        optional["maxPrincipalShare"] = _optional(st.sampled_from([0.34, 0.5, 0.75]))
    else:
        optional["maxAttempts"] = _optional(st.integers(1, 3))
        optional["maxTokens"] = _optional(st.integers(4, 12))
    for key, strategy in optional.items():
        value = draw(strategy)
        if value is not None:
            limits[key] = value
    return limits


@st.composite
def profiles(draw: st.DrawFn) -> dict[str, Any]:
    providers = {}
    for provider in draw(st.sampled_from([PROVIDERS[:1], PROVIDERS])):
        limits = draw(scope_limits(pool=True))
        if draw(st.booleans()):
            # Open for the whole run once tripped: no half-open probe depends on time.
            limits["circuitBreaker"] = {
                "failureThreshold": draw(st.integers(1, 2)),
                "openMs": 600_000,
                "halfOpenMaxCalls": 1,
            }
        providers[provider] = limits
    principals = {name: draw(scope_limits(pool=False)) for name in PRINCIPALS}
    reserving = draw(st.sampled_from([None, *PRINCIPALS]))
    if reserving is not None:
        principals[reserving]["reservedConcurrency"] = 1
    return {
        "profileVersion": "agree-v1",
        "workspace": draw(scope_limits(pool=True)),
        "providers": providers,
        "principals": principals,
    }


acquires = st.tuples(
    st.just("acquire"),
    st.sampled_from(PRINCIPALS),
    st.sampled_from(PROVIDERS),
    st.sampled_from([None, 0, 2, 5]),
    st.sampled_from(BUDGETS),
)
releases = st.tuples(
    st.just("release"),
    st.integers(0, 7),
    st.sampled_from([True, False, None, "retry"]),
    st.sampled_from([None, 1, 6]),
)
steps = st.lists(st.one_of(acquires, acquires, releases), min_size=1, max_size=14)


class Side:
    """One controller (in-process or coordinated), the decisions it reports, its leases."""

    def __init__(self, registry: AdmissionRegistry, profile: Profile) -> None:
        self.registry = registry
        self.controller = registry.controller(WORKSPACE)
        self.leases: list[Any] = []
        self.events: list[tuple[str, str, AdmissionRequest]] = []
        registry.on_decision(
            lambda event: self.events.append((event.decision, event.reason, event.request))
        )
        self.profile = profile

    async def decide(self, principal: str, provider: str, tokens: Any, budget: str) -> list[str]:
        """Ask once; a request that waits is cancelled once its deferral is seen."""
        signal = CancelSignal()
        estimate = Estimate() if tokens is None else Estimate(tokens=tokens)
        item = AdmissionRequest(budget, principal, WORKSPACE, provider, estimate, signal=signal)
        task = asyncio.ensure_future(self.controller.acquire(item))
        for _ in range(2000):
            if task.done() or any(e[2] is item and e[0] == "defer" for e in self.events):
                break
            await asyncio.sleep(0.001)
        if not task.done():
            signal.cancel()
        with contextlib.suppress(AdmissionRejected):
            self.leases.append(await asyncio.wait_for(task, 10))
        return [
            f"{decision}:{reason}" for decision, reason, request in self.events if request is item
        ]


def capacity_in_core(side: Side) -> dict[str, Any]:
    controller = side.controller
    figures = controller.live_figures()
    now = side.registry.clock.monotonic_ms()
    out: dict[str, Any] = {
        "W": (figures["workspace"]["a"], figures["workspace"]["q"]),
    }
    for provider, entry in figures["providers"].items():
        out[f"V:{provider}"] = (entry["a"], entry["q"], entry["breaker"])
    for principal in side.profile.principals:
        snapshot = controller.snapshot(principal)
        out[f"P:{principal}"] = (snapshot.active, snapshot.queued)
    scopes = {"W": controller._workspace}
    scopes.update({f"V:{k}": v for k, v in controller._providers.items()})
    scopes.update({f"P:{k}": v for k, v in controller._principals.items()})
    for name, limits in _limited(side.profile).items():
        rpm = limits.requests_per_minute
        scope = scopes.get(name)
        if rpm is not None:
            # A scope not made yet (never asked for) has a full bucket.
            bucket = scope.req_bucket if scope is not None else None
            out[f"rpm {name}"] = math.floor(bucket.refill(now) + 1e-9) if bucket else rpm
    return out


def _limited(profile: Profile) -> dict[str, Any]:
    limited: dict[str, Any] = {"W": profile.workspace}
    limited.update({f"V:{k}": v for k, v in profile.providers.items()})
    limited.update({f"P:{k}": v for k, v in profile.principals.items()})
    return limited


def capacity_in_redis(deployment: Deployment, profile: Profile) -> dict[str, Any]:
    def figures(name: str) -> dict[str, str]:
        return deployment.scope(name)

    w = figures("W")
    out: dict[str, Any] = {"W": (int(w.get("a", 0)), int(w.get("q", 0)))}
    for provider in profile.providers:
        v = figures(f"V:{provider}")
        out[f"V:{provider}"] = (int(v.get("a", 0)), int(v.get("q", 0)), v.get("bs", "closed"))
    for principal in profile.principals:
        p = figures(f"P:{principal}")
        out[f"P:{principal}"] = (int(p.get("a", 0)), int(p.get("q", 0)))
    for name, limits in _limited(profile).items():
        rpm = limits.requests_per_minute
        if rpm is not None:
            level = figures(name).get("rl")
            # An untouched (or refilled) bucket is full. Refill since is far below one request.
            out[f"rpm {name}"] = math.floor(float(level) + 1e-9) if level is not None else rpm
    return out


@settings(
    max_examples=int(os.environ.get("SLUICE_AGREEMENT_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(document=profiles(), sequence=steps)
def test_lua_functions_and_in_process_rules_agree(
    document: dict[str, Any], sequence: list[tuple[Any, ...]]
) -> None:
    try:
        profile = Profile.from_dict(document, workspace_id=WORKSPACE)
    except InvalidProfileError:
        return  # not a valid profile (reservations beyond a pool): nothing to compare
    deployment = Deployment(SHARED_REDIS, prefix=f"agree{uuid.uuid4().hex[:10]}")

    async def scenario() -> None:
        registry = AdmissionRegistry()
        registry.register(profile)
        local = Side(registry, profile)
        process = deployment.process()
        deployment.register(profile, process)
        shared = Side(process.registry, profile)
        for step in sequence:
            if step[0] == "acquire":
                _, principal, provider, tokens, budget = step
                if provider not in profile.providers:
                    provider = PROVIDERS[0]
                expected = await local.decide(principal, provider, tokens, budget)
                got = await shared.decide(principal, provider, tokens, budget)
                assert got == expected, (step, got, expected)
            else:
                _, index, outcome, actual = step
                if not local.leases:
                    continue
                index %= len(local.leases)
                for side in (local, shared):
                    lease = side.leases.pop(index)
                    if outcome == "retry":
                        lease.release(success=False, retry_after_ms=600_000)
                    else:
                        lease.release(success=outcome, actual_tokens=actual)
            await process.coordinator.settle()
            assert capacity_in_redis(deployment, profile) == capacity_in_core(local), step
        for side in (local, shared):
            for lease in side.leases:
                lease.release(success=None)
        await process.coordinator.settle()

    async def main() -> None:
        try:
            await asyncio.wait_for(scenario(), 120)
        finally:
            await deployment.close()

    try:
        asyncio.run(main())
    finally:
        deployment.cleanup()
