"""Controller invariants under random sequences of acquire, release, cancel, time and profiles."""

from __future__ import annotations

import asyncio
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    CancelSignal,
    Profile,
    VirtualTimeLoop,
)

from .conftest import examples, request

PRINCIPALS = ("quiet", "noisy", "reserved")
PROVIDERS = ("alpha", "beta")
BREAKER = {"failureThreshold": 2, "openMs": 300, "halfOpenMaxCalls": 1}


def document(version: str, scale: int) -> dict:
    """`scale` 2 is the normal profile, 1 the tightened one."""
    provider = {
        "concurrency": 1 + scale,
        "requestsPerMinute": 600 * scale,
        "tokensPerSecond": 2000,
        "maxQueueLength": 4,
        "maxQueueWaitMs": 400,
        "maxPrincipalShare": 0.75,
        "circuitBreaker": BREAKER,
    }
    return {
        "profileVersion": version,
        "workspace": {"concurrency": 3 * scale, "maxCostUsd": 2.0, "maxQueueLength": 6},
        "providers": {"alpha": provider, "beta": {**provider, "maxPrincipalShare": 1.0}},
        "principals": {
            "quiet": {"concurrency": scale, "maxAttempts": 4, "maxQueueWaitMs": 250},
            "noisy": {"concurrency": 2 * scale, "maxQueueLength": 5, "maxTokens": 3000},
            "reserved": {"concurrency": 2, "reservedConcurrency": 1},
        },
    }


NORMAL = Profile.from_dict(document("normal", 2), workspace_id="ws-1")
TIGHT = Profile.from_dict(document("tight", 1), workspace_id="ws-1")


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.registry = AdmissionRegistry(clock=self.loop.clock, rng=random.Random(3))
        self.controller = self.registry.register(NORMAL)
        self.tasks: list[tuple[asyncio.Task, CancelSignal]] = []
        self.leases: list = []
        self.violations: list[str] = []
        self.counter = 0
        self.registry.on_decision(self._check_decision)

    # Ceilings and budgets are judged at the moment of every admission, under the profile then.
    def _check_decision(self, event) -> None:
        if event.decision != "admit":
            return
        profile = self.controller.profile
        controller = self.controller
        request = event.request
        principal = controller._principals[request.principal_id]
        provider = controller._providers[request.provider_id]
        workspace = controller._workspace
        checks = [
            (principal.active, profile.principals[request.principal_id].concurrency, "principal"),
            (workspace.active, profile.workspace.concurrency, "workspace"),
            (provider.active, profile.providers[request.provider_id].concurrency, "provider"),
        ]
        for active, ceiling, name in checks:
            if active > ceiling:
                self.violations.append(f"{name} active {active} > {ceiling}")
        # Reservations others hold and do not use are never handed out.
        if workspace.active + workspace.unused_reserved > profile.workspace.concurrency:
            self.violations.append("workspace reservation handed out")
        pool = profile.providers[request.provider_id].concurrency
        if provider.active + provider.unused_reserved > pool:
            self.violations.append("provider reservation handed out")
        for scope in (principal, workspace, provider):
            used = scope.budgets.get(request.budget_id)
            limits = scope.limits
            if used is None:
                continue
            if limits.max_attempts is not None and used.attempts > limits.max_attempts:
                self.violations.append("attempt budget overspent")
            if limits.max_cost_usd is not None and used.cost > limits.max_cost_usd + 1e-9:
                self.violations.append("cost budget overspent")
            if limits.max_tokens is not None and used.tokens > limits.max_tokens:
                self.violations.append("token budget overspent")

    def _state(self) -> dict:
        now = self.loop.clock.monotonic_ms()
        controller = self.controller
        scopes = [
            controller._workspace,
            *controller._principals.values(),
            *controller._providers.values(),
        ]
        state = {}
        for scope in scopes:
            buckets = tuple(
                round(b.refill(now), 6) if b is not None else None
                for b in (scope.req_bucket, scope.tok_bucket)
            )
            budgets = tuple(
                sorted(
                    (k, v.attempts, round(v.cost, 9), v.tokens) for k, v in scope.budgets.items()
                )
            )
            full = all(
                b is None or b.refill(now) >= b.capacity - 1e-9
                for b in (scope.req_bucket, scope.tok_bucket)
            )
            state[(scope.kind, scope.key)] = (scope.active, buckets, budgets, full)
        return state

    def _settle(self) -> None:
        async def spin() -> None:
            for _ in range(6):
                await asyncio.sleep(0)

        self.loop.run_until_complete(spin())
        still = []
        for task, signal in self.tasks:
            if not task.done():
                still.append((task, signal))
            elif not task.cancelled() and task.exception() is None:
                self.leases.append(task.result())
        self.tasks = still

    @rule(
        # Mostly well-formed work, with a share of strangers and malformed estimates.
        principal=st.sampled_from(PRINCIPALS * 6 + ("stranger",)),
        provider=st.sampled_from(PROVIDERS * 6 + ("gamma",)),
        budget=st.integers(0, 3),
        tokens=st.sampled_from([50, 200, 400, 600, 1500] * 3 + [None, -1]),
        cost=st.sampled_from([0.05, 0.1, 0.3, 0.6] * 3 + [None, float("nan")]),
        deadline=st.sampled_from([None, None, None, None, None, 0, 100, 600]),
    )
    def acquire(self, principal, provider, budget, tokens, cost, deadline):
        before = self._state()
        signal = CancelSignal()
        now = self.loop.clock.monotonic_ms()
        req = request(
            principal,
            provider,
            f"inv-{budget}",
            tokens=tokens,
            cost_usd=cost,
            deadline_ms=None if deadline is None else now + deadline,
            signal=signal,
        )
        task = self.loop.create_task(self.controller.acquire(req))

        async def one_step() -> None:
            await asyncio.sleep(0)

        self.loop.run_until_complete(one_step())
        if task.done() and isinstance(task.exception(), AdmissionRejected):
            # A request refused on arrival consumed no bucket, budget or permit.
            after = self._state()
            reason = task.exception().reason
            for key, value in after.items():
                if key in before:
                    assert value == before[key], reason
                else:
                    assert value[0] == 0 and value[2] == () and value[3], reason
        self.tasks.append((task, signal))
        self._settle()

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 50), outcome=st.sampled_from(["ok", "fail", "none", "retry"]))
    def release(self, index, outcome):
        lease = self.leases.pop(index % len(self.leases))
        if outcome == "retry":
            lease.release(success=False, retry_after_ms=150)
        else:
            lease.release(
                success={"ok": True, "fail": False, "none": None}[outcome], actual_tokens=100
            )
        self._settle()

    @precondition(lambda self: self.tasks)
    @rule(index=st.integers(0, 50), by_signal=st.booleans())
    def cancel(self, index, by_signal):
        task, signal = self.tasks[index % len(self.tasks)]
        if by_signal:
            signal.cancel("caller")
        else:
            task.cancel()
        self._settle()

    @rule(ms=st.integers(1, 700))
    def advance(self, ms):
        self.loop.run_until_complete(asyncio.sleep(ms / 1000))
        self._settle()

    @rule(budget=st.integers(0, 3))
    def finish_invocation(self, budget):
        self.controller.release_budget(f"inv-{budget}")

    @rule(tight=st.booleans())
    def register(self, tight):
        self.registry.register(TIGHT if tight else NORMAL)
        self._settle()

    @invariant()
    def counts_match_live_waiters(self):
        assert not self.violations, self.violations
        controller = self.controller
        live = [t for t, _ in self.tasks if not t.done()]
        lanes = sum(len(lane.waiters) for lane in controller._lanes.values())
        assert lanes == controller._waiting == controller._workspace.queued == len(live)
        for name in PRINCIPALS:
            queued = sum(
                len(lane.waiters) for key, lane in controller._lanes.items() if key[1] == name
            )
            assert controller.snapshot(name).queued == queued
        active = sum(scope.active for scope in controller._principals.values())
        assert active == controller._workspace.active == len(self.leases)
        for scope in controller._providers.values():
            assert scope.active == sum(p.active for p in scope.pairs.values())
            assert scope.active <= NORMAL.providers[scope.key].concurrency

    def teardown(self):
        for lease in self.leases:
            lease.release(success=None)
        self.leases = []
        for task, _ in self.tasks:
            task.cancel()
        self._settle()
        for lease in self.leases:
            lease.release(success=None)
        controller = self.controller
        # No permit leaked once every lease is released.
        assert controller._workspace.active == 0
        assert all(s.active == 0 for s in controller._principals.values())
        assert all(s.active == 0 for s in controller._providers.values())
        assert controller._waiting == 0 and not controller._lanes
        assert controller._workspace.unused_reserved == 1
        self.loop.close()


ControllerMachine.TestCase.settings = settings(
    max_examples=examples(150),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestControllerInvariants = ControllerMachine.TestCase
