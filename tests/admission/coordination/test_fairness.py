"""Lanes are served round-robin across the deployment, not by which process asks first."""

from __future__ import annotations

import asyncio

from tests.admission.coordination.conftest import Deployment, profile, request, run, until

ONE = {"concurrency": 1, "maxQueueLength": 64}


def test_quiet_principal_is_served_within_one_rotation_of_a_spread_backlog(
    deployment: Deployment,
) -> None:
    # Every scope admits one at a time; the noisy principal holds the permit and has twelve
    # more requests waiting, spread over three processes. Then a quiet principal asks, from a
    # fourth process.
    procs = [deployment.process() for _ in range(5)]
    deployment.register(
        profile(
            workspace=ONE,
            providers={"llm": ONE},
            principals={"noisy": ONE, "quiet": ONE},
        )
    )
    admitted: list[str] = []

    async def ask(process_index: int, principal: str, budget: str) -> None:
        lease = await procs[process_index].controller().acquire(request(principal, budget=budget))
        admitted.append(principal)
        await asyncio.sleep(0.001)
        lease.release(success=True)

    async def scenario() -> None:
        holder = await procs[0].controller().acquire(request("noisy", budget="n-0"))
        backlog = [asyncio.ensure_future(ask(1 + i % 3, "noisy", f"n-{i + 1}")) for i in range(12)]
        await until(lambda: deployment.queued("P:noisy") == 12)
        quiet = asyncio.ensure_future(ask(4, "quiet", "q-1"))
        await until(lambda: deployment.queued("P:quiet") == 1)
        holder.release(success=True)
        await asyncio.wait_for(asyncio.gather(quiet, *backlog), 20)
        assert admitted.index("quiet") <= 1, admitted
        assert len(admitted) == 13

    run(deployment, scenario)


def test_lanes_alternate_when_both_have_a_backlog(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(4)]
    deployment.register(
        profile(workspace=ONE, providers={"llm": ONE}, principals={"a": ONE, "b": ONE})
    )
    admitted: list[str] = []

    async def ask(process_index: int, principal: str, budget: str) -> None:
        lease = await procs[process_index].controller().acquire(request(principal, budget=budget))
        admitted.append(principal)
        await asyncio.sleep(0.001)
        lease.release(success=True)

    async def scenario() -> None:
        holder = await procs[0].controller().acquire(request("a", budget="hold"))
        tasks = [asyncio.ensure_future(ask(1 + i % 3, "a", f"a-{i}")) for i in range(6)]
        await until(lambda: deployment.queued("P:a") == 6)
        tasks += [asyncio.ensure_future(ask(1 + i % 3, "b", f"b-{i}")) for i in range(6)]
        await until(lambda: deployment.queued("P:b") == 6)
        holder.release(success=True)
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        # Served alternately: no principal is admitted twice in a row while the other waits.
        assert admitted == ["a", "b"] * 6 or admitted == ["b", "a"] * 6, admitted

    run(deployment, scenario)
