"""A canary's admission (admission/runtime/canary.py): under the canary version's limits,
counted for the whole deployment, and within the active version's shared pools, so the provider
never sees more than the active ceiling. In one process on virtual time, and across two
simulated processes sharing a real Redis (the canary under a key space of its own)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import AdmissionRegistry, AdmissionRejected, Profile, VirtualTimeLoop
from admission.runtime.canary import CanaryRegistry

from .conftest import WORKSPACE, Deployment, profile, request, run

ACTIVE_CEILING, CANARY_CEILING = 4, 2


def _profiles() -> tuple[Profile, Profile]:
    wide = {"concurrency": 100, "maxQueueLength": 1000, "maxQueueWaitMs": 60_000}
    principals = {"alice": dict(wide), "bob": dict(wide)}
    active = profile(
        "v-active", workspace=dict(wide), providers={"llm": {**wide, "concurrency": 4}}
    )
    canary = profile(
        "v-canary",
        workspace=dict(wide),
        providers={"llm": {**wide, "concurrency": 2}},
        principals=principals,
    )
    active = dataclasses.replace(active, principals=canary.principals)
    return active, canary


class InFlight:
    """Calls holding their leases now, in all and on the canary, with the highest marks."""

    def __init__(self) -> None:
        self.all = self.canary = self.max_all = self.max_canary = 0

    def enter(self, canary: bool) -> None:
        self.all += 1
        self.canary += canary
        self.max_all = max(self.max_all, self.all)
        self.max_canary = max(self.max_canary, self.canary)

    def leave(self, canary: bool) -> None:
        self.all -= 1
        self.canary -= canary


async def _call(controller: Any, budget: str, canary: bool, seen: InFlight, hold_s: float) -> str:
    try:
        lease = await controller.acquire(request("alice" if canary else "bob", budget=budget))
    except AdmissionRejected as rejected:
        return rejected.reason
    seen.enter(canary)
    try:
        await asyncio.sleep(hold_s)
    finally:
        seen.leave(canary)
        lease.release(success=True)
    return "admitted"


def test_in_one_process_canary_calls_stay_inside_both_ceilings() -> None:
    active_profile, canary_profile = _profiles()
    loop = VirtualTimeLoop()
    seen = InFlight()

    async def main() -> list[str]:
        active = AdmissionRegistry(clock=loop.clock)
        active.register(active_profile)
        canary = AdmissionRegistry(clock=loop.clock)
        canary.register(canary_profile)
        on_canary = CanaryRegistry(canary, active)
        # A canary run's ceilings and its recorded revision are the canary version's.
        assert on_canary.controller(WORKSPACE).profile.profile_version == "v-canary"
        assert on_canary.current_profile(WORKSPACE).profile_version == "v-canary"
        assert on_canary.shadow(WORKSPACE) is None
        rng = random.Random(7)
        calls = []
        for index in range(60):
            is_canary = index % 2 == 0
            registry: Any = on_canary if is_canary else active
            calls.append(
                _call(
                    registry.controller(WORKSPACE),
                    f"inv-{index}",
                    is_canary,
                    seen,
                    rng.uniform(0.05, 0.3),
                )
            )
        return list(await asyncio.gather(*calls))

    try:
        outcomes = loop.run_until_complete(main())
    finally:
        loop.close()
    assert outcomes == ["admitted"] * 60
    assert seen.max_all == ACTIVE_CEILING
    assert seen.max_canary == CANARY_CEILING


def test_a_canary_permit_goes_back_when_the_shared_pools_refuse() -> None:
    active_profile, canary_profile = _profiles()
    full = dataclasses.replace(
        active_profile,
        providers={
            "llm": dataclasses.replace(
                active_profile.providers["llm"], concurrency=1, max_queue_length=0
            )
        },
    )
    loop = VirtualTimeLoop()

    async def main() -> tuple[str, int]:
        active = AdmissionRegistry(clock=loop.clock)
        active_controller = active.register(full)
        canary = AdmissionRegistry(clock=loop.clock)
        canary_controller = canary.register(canary_profile)
        holder = await active_controller.acquire(request("bob", budget="b"))
        on_canary = CanaryRegistry(canary, active).controller(WORKSPACE)
        assert on_canary is not None
        try:
            await on_canary.acquire(request("alice", budget="c"))
        except AdmissionRejected as rejected:
            reason = rejected.reason
        holder.release(success=True)
        return reason, canary_controller.snapshot("alice").active

    try:
        reason, canary_active = loop.run_until_complete(main())
    finally:
        loop.close()
    assert reason == "queue-full"
    assert canary_active == 0


def test_across_two_processes_the_canary_is_counted_once_and_inside_the_active_pools(
    deployment: Deployment,
) -> None:
    active_profile, canary_profile = _profiles()
    seen = InFlight()

    async def scenario() -> list[str]:
        # Forty requests at once on a busy machine: round trips get room beyond the default.
        first = deployment.process(register=active_profile, timeout_ms=5_000)
        second = deployment.process(register=active_profile, timeout_ms=5_000)
        canaries = []
        for process in (first, second):
            settings: CoordinationSettings = process.coordinator.settings
            own = dataclasses.replace(settings, prefix=f"{settings.prefix}:canary:1")
            coordinator = RedisCoordinator(own)
            canary = AdmissionRegistry(controller_factory=coordinator.controller)
            canary.register(canary_profile, sequence=1)
            # Closed with the deployment's coordinators.
            deployment.processes.append(dataclasses.replace(process, coordinator=coordinator))
            canaries.append(CanaryRegistry(canary, process.registry))
        rng = random.Random(11)
        calls = []
        for index in range(40):
            is_canary = index % 2 == 0
            side = index % 4 < 2
            registry: Any = canaries[side] if is_canary else (first, second)[side].registry
            calls.append(
                _call(
                    registry.controller(WORKSPACE),
                    f"inv-{index}",
                    is_canary,
                    seen,
                    rng.uniform(0.02, 0.08),
                )
            )
        return list(await asyncio.gather(*calls))

    outcomes = run(deployment, scenario, timeout=60)
    assert outcomes == ["admitted"] * 40
    assert seen.max_all == ACTIVE_CEILING
    assert seen.max_canary == CANARY_CEILING


def _acquire_both_at_once_then_one_queued(registry: Any, hold_s: float) -> Any:
    """Three canary attempts on a canary ceiling of 2: the first two are decided at once, the
    third waits `hold_s` for the first one's permit. Returns the three leases' evidence."""

    async def main() -> list[Any]:
        controller = registry.controller(WORKSPACE)
        first = await controller.acquire(request("alice", budget="c-1"))
        second = await controller.acquire(request("alice", budget="c-2"))
        third = asyncio.ensure_future(controller.acquire(request("alice", budget="c-3")))
        await asyncio.sleep(hold_s)
        first.release(success=True)
        waited = await third
        second.release(success=True)
        waited.release(success=True)
        return [first.evidence, second.evidence, waited.evidence]

    return main()


def test_a_canary_attempt_decided_at_once_records_no_queue_delay() -> None:
    # On the real clock: time passes between the two sides' decisions, yet neither waited.
    active_profile, canary_profile = _profiles()

    async def main() -> list[Any]:
        active = AdmissionRegistry()
        active.register(active_profile)
        canary = AdmissionRegistry()
        canary.register(canary_profile)
        return await _acquire_both_at_once_then_one_queued(CanaryRegistry(canary, active), 0.05)

    first, second, third = asyncio.run(main())
    assert first.queue_delay_ms == 0.0
    assert second.queue_delay_ms == 0.0
    assert 50.0 <= third.queue_delay_ms < 1_000.0
    assert first.queued == 0 and third.decision == "admit"


def test_a_queued_canary_attempt_records_the_wait_of_both_sides() -> None:
    active_profile, canary_profile = _profiles()
    one_active = dataclasses.replace(
        active_profile,
        providers={"llm": dataclasses.replace(active_profile.providers["llm"], concurrency=1)},
    )
    loop = VirtualTimeLoop()

    async def main() -> tuple[float, float]:
        active = AdmissionRegistry(clock=loop.clock)
        active_controller = active.register(one_active)
        canary = AdmissionRegistry(clock=loop.clock)
        canary.register(canary_profile)
        on_canary = CanaryRegistry(canary, active).controller(WORKSPACE)
        assert on_canary is not None
        # The active pool is full: the canary permit is granted at once, the active one after
        # 0.3 s; then a canary attempt that both sides admit at once.
        holder = await active_controller.acquire(request("bob", budget="b"))
        waiting = asyncio.ensure_future(on_canary.acquire(request("alice", budget="c-1")))
        await asyncio.sleep(0.3)
        holder.release(success=True)
        lease = await waiting
        lease.release(success=True)
        at_once = await on_canary.acquire(request("alice", budget="c-2"))
        at_once.release(success=True)
        return lease.evidence.queue_delay_ms, at_once.evidence.queue_delay_ms

    try:
        waited, at_once = loop.run_until_complete(main())
    finally:
        loop.close()
    assert waited == 300.0
    assert at_once == 0.0


def test_with_redis_a_canary_attempt_decided_at_once_records_no_queue_delay(
    deployment: Deployment,
) -> None:
    # Each side's decision is a round trip to Redis; neither is a queue wait.
    active_profile, canary_profile = _profiles()

    async def scenario() -> list[Any]:
        process = deployment.process(register=active_profile, timeout_ms=5_000)
        settings: CoordinationSettings = process.coordinator.settings
        own = dataclasses.replace(settings, prefix=f"{settings.prefix}:canary:1")
        coordinator = RedisCoordinator(own)
        canary = AdmissionRegistry(controller_factory=coordinator.controller)
        canary.register(canary_profile, sequence=1)
        deployment.processes.append(dataclasses.replace(process, coordinator=coordinator))
        registry = CanaryRegistry(canary, process.registry)
        return list(await _acquire_both_at_once_then_one_queued(registry, 0.2))

    first, second, third = run(deployment, scenario, timeout=30)
    assert first.queue_delay_ms == 0.0
    assert second.queue_delay_ms == 0.0
    assert third.queue_delay_ms >= 150.0
