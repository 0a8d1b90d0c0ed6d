"""A shadow decided for the whole deployment: two simulated processes mirror their real requests
to one shadow state in Redis (a key space of its own), so the shadow's verdict for the load of
both equals what one process computes over the same arrivals, the real side is what it is
without a shadow, and each run's tallies are its own."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from admission.coordination import RedisCoordinator
from admission.core import AdmissionRegistry, Profile, VirtualTimeLoop, merge_tallies

from .conftest import WORKSPACE, Deployment, profile, request, run, until

ARRIVALS = 20


def _profiles() -> tuple[Profile, Profile]:
    wide = {"concurrency": 100, "maxQueueLength": 1000, "maxQueueWaitMs": 60_000}
    real = profile("v-real", workspace=dict(wide), providers={"llm": dict(wide)})
    # The shadow: two calls at the provider and no queue.
    tight = profile(
        "v-tight",
        workspace=dict(wide),
        providers={"llm": {"concurrency": 2, "maxQueueLength": 0}},
    )
    return real, tight


async def _arrive(
    registry: AdmissionRegistry,
    shadow: Any,
    index: int,
    hold_s: float,
    hold: Callable[[], Awaitable[None]] | None = None,
) -> str:
    """One real request, mirrored to `shadow` if there is one, held `hold_s` (after `hold`
    returns, when given) and released."""
    controller: Any = registry.controller(WORKSPACE)
    real = request("alice", budget=f"run-{index}/b")
    call = shadow.mirror(real) if shadow is not None else None
    lease = await controller.acquire(real)
    if call is not None:
        call.admitted(lease)
    if hold is not None:
        await hold()
    await asyncio.sleep(hold_s)
    lease.release(success=True)
    if call is not None:
        call.released(lease, success=True)
    return lease.evidence.decision


def _unshadowed(deployment: Deployment) -> list[str]:
    real_profile, _ = _profiles()

    async def scenario() -> list[str]:
        hosts = [deployment.process(register=real_profile, timeout_ms=5_000) for _ in range(2)]
        return list(
            await asyncio.gather(
                *(_arrive(hosts[i % 2].registry, None, i, 0.3) for i in range(ARRIVALS))
            )
        )

    return run(deployment, scenario, timeout=60)


def _shadowed(deployment: Deployment, processes: int) -> tuple[list[str], dict[str, Any]]:
    real_profile, tight = _profiles()

    async def scenario() -> tuple[list[str], dict[str, Any]]:
        hosts = [
            deployment.process(register=real_profile, timeout_ms=5_000) for _ in range(processes)
        ]
        shadows = []
        for host in hosts:
            settings = host.coordinator.settings
            own = dataclasses.replace(settings, prefix=f"{settings.prefix}:shadow:1")
            coordinator = RedisCoordinator(own)
            shared = AdmissionRegistry(controller_factory=coordinator.controller)
            shared.register(tight, sequence=1)
            deployment.processes.append(dataclasses.replace(host, coordinator=coordinator))
            shadows.append(host.registry.start_shadow(tight, session=1, registry=shared))

        def all_decided() -> bool:
            return (
                sum(
                    shadows[i % processes].tallies(f"run-{i}/b")[1].requests
                    for i in range(ARRIVALS)
                )
                == ARRIVALS
            )

        async def hold() -> None:
            # Reality holds its permits until the shadow has decided every copy: a copy holds
            # its shadow permit as long as reality held the real one, so none goes back before
            # the last copy is decided, however slowly the shadow's first calls go.
            await until(all_decided, timeout=30)

        decisions = await asyncio.gather(
            *(
                _arrive(hosts[i % processes].registry, shadows[i % processes], i, 0.3, hold)
                for i in range(ARRIVALS)
            )
        )
        # Each process drains its runs; the deployment's verdict is their sum.
        actives, would_be = [], []
        for index in range(ARRIVALS):
            active, shadow = shadows[index % processes].drain(f"run-{index}")
            assert active["requests"] == 1, active
            assert shadow["requests"] == 1, shadow
            actives.append(active)
            would_be.append(shadow)
        return list(decisions), {
            "active": merge_tallies(actives),
            "shadow": merge_tallies(would_be),
        }

    return run(deployment, scenario, timeout=60)


def test_two_processes_share_one_shadow_and_it_judges_their_load_together(
    deployment: Deployment,
) -> None:
    plain = _unshadowed(deployment)
    deployment.cleanup()
    one_decisions, one = _shadowed(deployment, 1)
    deployment.cleanup()
    two_decisions, two = _shadowed(deployment, 2)
    # Reality is untouched: every real request decided as without a shadow.
    assert one_decisions == two_decisions == plain == ["admit"] * ARRIVALS
    counts = ("requests", "retries", "admitted", "rejected")
    assert {key: one["active"][key] for key in counts} == {
        key: two["active"][key] for key in counts
    }
    assert two["active"]["admitted"] == ARRIVALS
    # The tight shadow saw the whole load once: two admitted, the rest refused, as in one
    # process (each process alone would have admitted two: four in all).
    assert one["shadow"]["admitted"] == 2
    assert two["shadow"]["admitted"] == one["shadow"]["admitted"]
    assert two["shadow"]["rejected"] == one["shadow"]["rejected"] == {"queue-full": ARRIVALS - 2}


def test_each_run_drains_its_own_tallies_and_late_counts_are_not_lost() -> None:
    real_profile, tight = _profiles()
    loop = VirtualTimeLoop()

    async def main() -> tuple[Any, Any, Any]:
        registry = AdmissionRegistry(clock=loop.clock)
        registry.register(real_profile)
        shadow = registry.start_shadow(tight)
        await asyncio.gather(*(_arrive(registry, shadow, i % 3, 0.1) for i in range(6)))
        first = shadow.drain("run-0")
        # A request of run-0 after its drain is kept for the next drain, not dropped.
        await _arrive(registry, shadow, 0, 0.1)
        second = shadow.drain("run-1")
        rest = shadow.drain()
        return first, second, rest

    try:
        first, second, rest = loop.run_until_complete(main())
    finally:
        loop.close()
    assert (first[0]["requests"], first[1]["requests"]) == (2, 2)
    assert (second[0]["requests"], second[1]["requests"]) == (3, 3)
    assert (rest[0]["requests"], rest[1]["requests"]) == (2, 2)
