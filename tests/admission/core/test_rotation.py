"""CNC-ADMIT-019: lanes that can proceed are served least recently served first, whatever woke them.

Each scenario parks a noisy lane (one permit held, a backlog behind it) and a quiet lane on
different things: a principal's permits, the workspace's, the provider's, a token bucket's
reservation holder, a provider's Retry-After pause. Every admitted call releases 1 ms after its
admission. Lanes that start waiting together are served first come, first served; from then on
the lane served longest ago goes next, so the quiet lane is never behind the noisy backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from admission.core import AdmissionRegistry, Profile, VirtualTimeLoop
from admission.core.rotation import Rotation

from .conftest import WORKSPACE, Scenario, make_profile, rejection_of, request

HOLD_S = 0.001


async def _call(s: Scenario, served: list[str], principal: str, budget: str, **estimate: Any):
    lease = await s.controller.acquire(request(principal, budget=budget, **estimate))
    served.append(principal)
    await asyncio.sleep(HOLD_S)
    lease.release(success=True)


async def _noisy_then_quiet(s: Scenario, noisy: int, quiet: int, **estimate: Any) -> list[str]:
    """`noisy` calls, the first admitted at once, then `quiet` calls; the order they got in."""
    served: list[str] = []
    tasks = [asyncio.ensure_future(_call(s, served, "noisy", "n0", **estimate))]
    await asyncio.sleep(0)
    assert served == ["noisy"]
    tasks += [
        asyncio.ensure_future(_call(s, served, "noisy", f"n{i}", **estimate))
        for i in range(1, noisy)
    ]
    await asyncio.sleep(0)
    tasks += [
        asyncio.ensure_future(_call(s, served, "quiet", f"q{i}", **estimate)) for i in range(quiet)
    ]
    await asyncio.gather(*tasks)
    return served


N, Q = "noisy", "quiet"


async def _interrupted(s: Scenario, interrupt: Callable[[], None]) -> list[str]:
    """Four noisy calls, then two quiet ones; `interrupt` runs just after the noisy lane's turn."""
    served: list[str] = []
    tasks = [asyncio.ensure_future(_call(s, served, N, f"n{i}")) for i in range(4)]
    await asyncio.sleep(0)
    tasks += [asyncio.ensure_future(_call(s, served, Q, f"q{i}")) for i in range(2)]
    await asyncio.sleep(0.0015)
    assert served == [N, N]  # the noisy lane has just been served
    interrupt()
    await asyncio.gather(*tasks)
    return served


def test_CNC_ADMIT_019_a_quiet_principal_waits_for_one_noisy_turn_not_the_backlog(
    scenario_factory,
):
    # Every scope admits one call: the noisy lane parks on its principal, the quiet one on the
    # workspace, and a release wakes the noisy lane first.
    one = {"concurrency": 1, "maxQueueLength": 64}
    s = scenario_factory(
        make_profile(workspace=one, providers={"llm": one}, principals={N: one, Q: one})
    )
    served = s.run(lambda s: _noisy_then_quiet(s, noisy=13, quiet=1))
    assert served == [N, N, Q, *[N] * 11]


ONE, TEN = {"concurrency": 1}, {"concurrency": 10}


@pytest.mark.parametrize(
    ("parked_on", "limits"),
    [
        ("workspace", {"workspace": {"concurrency": 1}, "principals": {N: TEN, Q: TEN}}),
        ("provider", {"providers": {"llm": {"concurrency": 1}}, "principals": {N: TEN, Q: TEN}}),
        (
            "principal and provider",
            {
                "providers": {"llm": {"concurrency": 1}},
                "principals": {N: {"concurrency": 1}, Q: TEN},
            },
        ),
    ],
)
def test_CNC_ADMIT_019_lanes_parked_on_scopes_alternate(scenario_factory, parked_on, limits):
    s = scenario_factory(make_profile(**limits))
    served = s.run(lambda s: _noisy_then_quiet(s, noisy=5, quiet=3))
    assert served == [N, N, Q, N, Q, N, Q, N], parked_on


def test_CNC_ADMIT_019_lanes_behind_a_token_holder_alternate(scenario_factory):
    # One call's tokens fill the bucket: each waits for a second of refill, and a waiter that
    # cannot fit beside the reservation holder parks until the hold ends.
    s = scenario_factory(
        make_profile(
            providers={"llm": {"concurrency": 10, "tokensPerSecond": 100}},
            principals={N: {"concurrency": 10}, Q: {"concurrency": 10}},
        )
    )

    async def body(s: Scenario) -> list[str]:
        served = await _noisy_then_quiet(s, noisy=4, quiet=2, tokens=100)
        assert s.now() == 5000 + 1
        return served

    assert s.run(body) == [N, N, Q, N, Q, N]


def test_CNC_ADMIT_019_lanes_paused_by_retry_after_resume_by_turn(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            principals={N: {"concurrency": 1}, Q: {"concurrency": 10}},
        )
    )

    # At 2 ms the noisy lane is woken first (its principal's permit) and parks on the pause
    # first; when the pause ends both lanes are due at once, and the quiet one goes first.
    def pause() -> None:
        s.controller.coordinate_retry_after("llm", 10)

    assert s.run(lambda s: _interrupted(s, pause)) == [N, N, Q, N, Q, N]


def test_CNC_ADMIT_019_evicting_idle_principals_changes_no_order():
    principals = {f"p{i}": {"concurrency": 5} for i in range(6)}

    def order(max_idle_scopes: int) -> list[str]:
        loop = VirtualTimeLoop()
        registry = AdmissionRegistry(clock=loop.clock, max_idle_scopes=max_idle_scopes)
        profile = make_profile(workspace={"concurrency": 1}, principals=principals)
        scenario = Scenario.__new__(Scenario)
        scenario.loop, scenario.registry = loop, registry
        scenario.controller = registry.register(profile)
        served: list[str] = []

        async def body(s: Scenario) -> None:
            tasks = []
            # Principals come and go: each call of a wave waits, is served and leaves its lane.
            for wave in range(4):
                for i in (wave, wave + 1, wave + 2):
                    tasks.append(asyncio.ensure_future(_call(s, served, f"p{i}", f"w{wave}-{i}")))
                await asyncio.sleep(0.0025)
            await asyncio.gather(*tasks)

        try:
            scenario.run(body)
        finally:
            scenario.close()
        return served

    assert order(max_idle_scopes=0) == order(max_idle_scopes=1024)


class _Lane:
    def __init__(self, name: str, turn: int) -> None:
        self.name = name
        self.turn = turn


def test_rotation_serves_lowest_turn_first_and_ties_in_arrival_order():
    rotation: Rotation[_Lane] = Rotation()
    a, b, c, d = _Lane("a", 5), _Lane("b", 3), _Lane("c", 5), _Lane("d", 3)
    for lane in (a, b, c, d):
        rotation.add(lane)
    rotation.discard(d)
    assert len(rotation) == 3 and d not in rotation
    assert rotation.first(lambda lane: lane.name == "b") is a
    assert [rotation.take(), rotation.take(), rotation.take(), rotation.take()] == [b, a, c, None]
    assert not rotation


def test_rotation_moves_a_member_to_its_new_turn_and_stays_compact():
    rotation: Rotation[_Lane] = Rotation()
    lanes = [_Lane(str(i), i) for i in range(10)]
    for lane in lanes:
        rotation.add(lane)
    for step in range(1000):
        lane = lanes[step % 10]
        lane.turn += 10
        rotation.add(lane)
    assert len(rotation) == 10
    assert len(rotation._heap) <= 2 * 10 + 32
    assert [rotation.take() for _ in range(10)] == lanes


def test_profile_change_serves_woken_lanes_by_turn(scenario_factory):
    # A new profile wakes every lane at once; the least recently served lane still goes first.
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            principals={N: {"concurrency": 10}, Q: {"concurrency": 10}},
        )
    )

    def change_profile() -> None:
        document: dict[str, Any] = {
            "profileVersion": "v2",
            "workspace": {"concurrency": 2},
            "providers": {"llm": {"concurrency": 100}},
            "principals": {N: {"concurrency": 10}, Q: {"concurrency": 10}},
        }
        s.registry.register(Profile.from_dict(document, workspace_id=WORKSPACE))

    assert s.run(lambda s: _interrupted(s, change_profile)) == [N, N, Q, N, Q, N]


def test_CNC_ADMIT_019_a_lane_served_after_the_oldest_waiter_ranks_by_its_own_turn(
    scenario_factory,
):
    # Quiet waits (since before anyone else was served); noisy is then admitted at once and
    # queues a second call, and rest queues one. Noisy was served after quiet started waiting,
    # so it keeps its own turn and ranks behind rest, who was never served.
    R = "rest"
    one = {"concurrency": 1}
    s = scenario_factory(
        make_profile(workspace={"concurrency": 2}, principals={Q: one, N: one, R: one})
    )

    async def body(s: Scenario) -> list[str]:
        served: list[str] = []
        tasks = [asyncio.ensure_future(_call(s, served, Q, f"q{i}")) for i in range(2)]
        await asyncio.sleep(0)
        tasks += [asyncio.ensure_future(_call(s, served, N, f"n{i}")) for i in range(2)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(_call(s, served, R, "r0")))
        await asyncio.gather(*tasks)
        return served

    # At 1 ms both first calls release: quiet's lane and rest's go before noisy's second call.
    assert s.run(body) == [Q, N, Q, R, N]


def test_a_waiter_refused_under_a_new_profile_does_not_hold_up_the_one_behind_it(scenario_factory):
    # The lane is served again at once after its head is rejected, not at the next wake-up.
    s = scenario_factory(make_profile(workspace={"concurrency": 1}))

    async def body(s: Scenario) -> None:
        holder = await s.admit(request("alice", budget="h"))
        big = s.start(request("alice", budget="big", tokens=500))
        small = s.start(request("alice", budget="small", tokens=5))
        await s.settle()
        document: dict[str, Any] = {
            "profileVersion": "v2",
            "workspace": {"concurrency": 2, "maxTokens": 100},
            "providers": {"llm": {"concurrency": 100}},
            "principals": {"alice": {"concurrency": 100}, "bob": {"concurrency": 100}},
        }
        s.registry.register(Profile.from_dict(document, workspace_id=WORKSPACE))
        await s.settle()
        assert rejection_of(big).reason == "tokens"
        assert small.done() and small.result().evidence.decision == "admit"
        small.result().release()
        holder.release()

    s.run(body)


def test_a_woken_lane_that_cannot_use_the_permit_passes_the_wake_on(scenario_factory):
    # Both lanes wait for the workspace's one permit. The release wakes the first; its provider
    # is paused, so it passes the wake to the next lane, which is admitted at the release.
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            providers={"paused": {"concurrency": 10}, "llm": {"concurrency": 10}},
            principals={N: TEN, Q: TEN, "holder": TEN},
        )
    )

    async def body(s: Scenario) -> None:
        holder = await s.admit(request("holder", budget="h"))
        first = s.start(request(N, "paused", budget="n"))
        second = s.start(request(Q, "llm", budget="q"))
        await s.settle()
        s.controller.coordinate_retry_after("paused", 1000)
        await asyncio.sleep(0.005)
        holder.release()
        await s.settle()
        assert second.done() and second.result().evidence.queue_delay_ms == 5
        assert not first.done()
        second.result().release()
        lease = await first
        assert s.now() == 1000
        lease.release()

    s.run(body)


def test_defer_decisions_name_what_the_waiter_waits_for(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            providers={
                "llm": {
                    "concurrency": 10,
                    "circuitBreaker": {"failureThreshold": 1, "openMs": 100},
                }
            },
        )
    )
    defers: list[str] = []
    s.registry.on_decision(
        lambda event: defers.append(event.reason) if event.decision == "defer" else None
    )

    async def body(s: Scenario) -> None:
        holder = await s.admit(request("alice", budget="h"))
        waiting = s.start(request("bob", budget="w"))
        await s.settle()
        s.controller.coordinate_retry_after("llm", 10)
        holder.release(success=True)
        await s.settle()
        (await waiting).release(success=False)  # opens the breaker
        late = s.start(request("bob", budget="late"))
        await s.settle()
        (await late).release(success=True)

    s.run(body)
    assert defers == ["concurrency", "retry-after", "circuit-open"]


def test_CNC_ADMIT_019_a_principal_never_served_ranks_ahead_of_one_just_served(scenario_factory):
    # The provider admits one call at a time and is paused before anything was ever admitted,
    # so alice's and bob's lanes start waiting together; carol arrives once alice was served.
    one = {"concurrency": 1}
    s = scenario_factory(
        make_profile(
            providers={"llm": one},
            principals={"alice": {"concurrency": 5}, "bob": one, "carol": one},
        )
    )

    async def body(s):
        served: list[str] = []
        s.controller.coordinate_retry_after("llm", 10)
        tasks = [asyncio.ensure_future(_call(s, served, "alice", f"a{i}")) for i in range(2)]
        tasks.append(asyncio.ensure_future(_call(s, served, "bob", "b")))
        await asyncio.sleep(0.0105)
        assert served == ["alice"]
        tasks.append(asyncio.ensure_future(_call(s, served, "carol", "c")))
        await asyncio.gather(*tasks)
        return served

    # carol has never been served: she goes before alice's second call, as bob does.
    assert s.run(body) == ["alice", "bob", "carol", "alice"]


@pytest.mark.parametrize(
    ("holder", "waiter", "limits"),
    [
        ("alice", "alice", {"principals": {"alice": {"concurrency": 1}}}),
        ("alice", "bob", {"providers": {"llm": {"concurrency": 1}}}),
        ("alice", "alice", {"workspace": {"concurrency": 4, "maxPrincipalShare": 0.25}}),
        ("alice", "alice", {"providers": {"llm": {"concurrency": 4, "maxPrincipalShare": 0.25}}}),
        (
            "alice",
            "alice",
            {
                "workspace": {"concurrency": 2},
                "principals": {"alice": {"concurrency": 5}, "bob": {"reservedConcurrency": 1}},
            },
        ),
        (
            "alice",
            "alice",
            {
                "providers": {"llm": {"concurrency": 2}},
                "principals": {"alice": {"concurrency": 5}, "bob": {"reservedConcurrency": 1}},
            },
        ),
    ],
    ids=[
        "principal",
        "provider",
        "workspace-share",
        "provider-share",
        "workspace-reservation",
        "provider-reservation",
    ],
)
def test_every_permit_cap_defers_with_the_reason_concurrency(
    scenario_factory, holder, waiter, limits
):
    principals = limits.get("principals", {"alice": {"concurrency": 5}, "bob": {"concurrency": 5}})
    for own in principals.values():
        own.setdefault("concurrency", 5)
    s = scenario_factory(make_profile(**{**limits, "principals": principals}))
    decisions: list[tuple[str, str]] = []
    s.registry.on_decision(lambda event: decisions.append((event.decision, event.reason)))

    async def body(s: Scenario) -> None:
        held = await s.admit(request(holder, budget="h"))
        waiting = s.start(request(waiter, budget="w"))
        await s.settle()
        held.release(success=True)
        (await waiting).release(success=True)

    s.run(body)
    assert decisions == [("admit", "admitted"), ("defer", "concurrency"), ("admit", "admitted")]


@pytest.mark.parametrize("arrival_ms", range(30, 46))
def test_CNC_ADMIT_019_a_new_lane_goes_next_after_many_turns(scenario_factory, arrival_ms):
    # Two lanes alternate for sixty turns (the controller's heap of turns is swept of stale
    # entries on the way); a third principal who arrives meanwhile has never been served, so
    # it goes next, whenever it arrives.
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            principals={p: {"concurrency": 5} for p in ("a", "b", "c")},
        )
    )

    async def body(s: Scenario) -> tuple[int, list[str]]:
        served: list[str] = []
        tasks = [
            asyncio.ensure_future(_call(s, served, p, f"{p}{i}"))
            for i in range(30)
            for p in ("a", "b")
        ]
        await asyncio.sleep((arrival_ms + 0.5) / 1000)
        arrived_after = len(served)
        tasks.append(asyncio.ensure_future(_call(s, served, "c", "c0")))
        await asyncio.gather(*tasks)
        return served.index("c") - arrived_after, [p for p in served if p != "c"]

    assert s.run(body) == (0, ["a", "b"] * 30)


def test_a_waiter_deferred_again_for_the_same_reason_is_reported_once(scenario_factory):
    def profile(version: str):
        return make_profile(version=version, principals={"alice": {"concurrency": 1}})

    s = scenario_factory(profile("v1"))
    defers: list[tuple[str, str]] = []
    s.registry.on_decision(
        lambda event: (
            defers.append((event.reason, event.request.budget_id))
            if event.decision == "defer"
            else None
        )
    )

    async def body(s: Scenario) -> None:
        held = await s.admit(request(budget="h"))
        waiting = s.start(request(budget="w"))
        await s.settle()
        # The new profile revalidates the waiter, which is deferred again on the same permit.
        s.registry.register(profile("v2"))
        await s.settle()
        held.release()
        (await waiting).release()

    s.run(body)
    assert defers == [("concurrency", "w")]
