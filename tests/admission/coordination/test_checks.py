"""The shared checks, decided in Redis, hold across processes: one test per rule."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from admission.core import AdmissionRejected, CancelSignal
from tests.admission.coordination.conftest import (
    WORKSPACE,
    Deployment,
    Process,
    profile,
    request,
    run,
    settle,
    until,
)
from tests.private_services import PrivateRedis


def test_evidence_counts_the_whole_deployment(deployment: Deployment) -> None:
    first = deployment.process(register=profile())
    second = deployment.process()
    deployment.register(profile(), second)

    async def scenario() -> None:
        one = await first.controller().acquire(request())
        two = await second.controller().acquire(request())
        # The second process sees the first one's permit: active counts the deployment.
        assert one.evidence.active == 1
        assert two.evidence.active == 2
        assert second.controller().snapshot("alice").active == 2
        one.release(success=True)
        two.release(success=True)
        await settle(deployment)
        assert deployment.active("P:alice") == 0

    run(deployment, scenario)


@pytest.mark.parametrize(
    ("scope", "limits"),
    [
        ("principal", {"principals": {"alice": {"concurrency": 2}, "bob": {"concurrency": 9}}}),
        ("workspace", {"workspace": {"concurrency": 2}}),
        ("provider", {"providers": {"llm": {"concurrency": 2}}}),
    ],
)
def test_concurrency_holds_across_processes(
    deployment: Deployment, scope: str, limits: dict
) -> None:
    procs = [deployment.process() for _ in range(3)]
    deployment.register(profile(**limits))

    async def scenario() -> None:
        held = [
            await procs[0].controller().acquire(request()),
            await procs[1].controller().acquire(request()),
        ]
        waiting = asyncio.ensure_future(procs[2].controller().acquire(request()))
        await until(lambda: deployment.queued("W") == 1)
        assert not waiting.done()
        assert deployment.active("W") == 2
        held[1].release(success=True)
        lease = await asyncio.wait_for(waiting, 5)
        assert lease.evidence.queue_delay_ms > 0
        assert deployment.active("W") == 2
        for item in (held[0], lease):
            item.release(success=True)
        await settle(deployment)
        assert deployment.active("W") == 0 and deployment.queued("W") == 0

    run(deployment, scenario)


def test_provider_share_cap_leaves_room_for_others(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(providers={"llm": {"concurrency": 4, "maxPrincipalShare": 0.5}}))

    async def scenario() -> None:
        mine = [await procs[i % 2].controller().acquire(request("alice")) for i in range(2)]
        third = asyncio.ensure_future(procs[0].controller().acquire(request("alice")))
        await until(lambda: deployment.queued("P:alice") == 1)
        # Bob still gets in: the cap is alice's share of the pool, not the pool.
        bob = await procs[1].controller().acquire(request("bob"))
        assert not third.done()
        mine[0].release(success=True)
        lease = await asyncio.wait_for(third, 5)
        for item in (mine[1], bob, lease):
            item.release(success=True)

    run(deployment, scenario)


def test_reservation_is_held_back_from_other_principals(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(
        profile(
            workspace={"concurrency": 2},
            principals={
                "alice": {"concurrency": 2},
                "bob": {"concurrency": 1, "reservedConcurrency": 1},
            },
        )
    )

    async def scenario() -> None:
        alice = await procs[0].controller().acquire(request("alice"))
        # The second permit is bob's reservation: alice waits although one is free.
        blocked = asyncio.ensure_future(procs[1].controller().acquire(request("alice")))
        await until(lambda: deployment.queued("P:alice") == 1)
        bob = await procs[1].controller().acquire(request("bob"))
        assert bob.evidence.queue_delay_ms < 1_000 and not blocked.done()
        bob.release(success=True)
        alice.release(success=True)
        second = await asyncio.wait_for(blocked, 5)
        second.release(success=True)

    run(deployment, scenario)


def test_retry_after_pauses_every_process_and_never_shortens(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(providers={"llm": {"concurrency": 10}}))

    async def scenario() -> None:
        lease = await procs[0].controller().acquire(request())
        started = time.monotonic()
        lease.release(success=False, retry_after_ms=400)
        await settle(deployment)
        # A shorter pause asked later does not shorten the one in force.
        procs[1].controller().coordinate_retry_after("llm", 50)
        await settle(deployment)
        waiting = await procs[1].controller().acquire(request(budget="other"))
        assert time.monotonic() - started >= 0.38
        assert waiting.evidence.retry_pressure >= 2
        waiting.release(success=True)

    run(deployment, scenario)


def test_half_open_breaker_lets_one_probe_through_for_the_deployment(
    deployment: Deployment,
) -> None:
    procs = [deployment.process() for _ in range(3)]
    breaker = {"failureThreshold": 1, "openMs": 300, "halfOpenMaxCalls": 1}
    deployment.register(profile(providers={"llm": {"concurrency": 10, "circuitBreaker": breaker}}))

    async def scenario() -> None:
        failing = await procs[0].controller().acquire(request())
        failing.release(success=False)
        await settle(deployment)
        assert deployment.scope("V:llm")["bs"] == "open"
        # After openMs two processes ask at once: one probe, the other waits for its outcome.
        first = asyncio.ensure_future(procs[1].controller().acquire(request(budget="a")))
        second = asyncio.ensure_future(procs[2].controller().acquire(request(budget="b")))
        done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        probe = done.pop().result()
        assert probe.evidence.breaker_state == "half-open"
        assert [t.to_state for t in probe.evidence.breaker_transitions] == ["half-open"]
        await asyncio.sleep(0.05)
        assert len(pending) == 1 and not next(iter(pending)).done()
        probe.release(success=True)
        other = await asyncio.wait_for(pending.pop(), 5)
        assert other.evidence.breaker_state == "closed"
        other.release(success=True)
        await settle(deployment)
        transitions = [t.to_state for p in procs for t in p.controller().breaker_transitions()]
        assert sorted(transitions) == ["closed", "half-open", "open"]

    run(deployment, scenario)


def test_invocation_budget_rejects_and_consumes_nothing(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(
        profile(
            principals={"alice": {"concurrency": 9, "maxAttempts": 2, "maxTokens": 100}},
            providers={"llm": {"concurrency": 9, "requestsPerMinute": 100}},
        )
    )

    async def scenario() -> None:
        leases = [
            await procs[i].controller().acquire(request(tokens=30, budget="inv")) for i in (0, 1)
        ]
        for lease in leases:
            lease.release(success=True, actual_tokens=20)
        await settle(deployment)
        before = deployment.scope("V:llm")
        with pytest.raises(AdmissionRejected) as refused:
            await procs[0].controller().acquire(request(tokens=1, budget="inv"))
        assert refused.value.reason == "attempts" and not refused.value.retryable
        # Nothing was consumed by the refusal: the bucket is where it was.
        assert deployment.scope("V:llm") == before
        # Tokens reconciled to 40 actually used: 60 more fit, 61 do not (another budget).
        procs[1].controller().release_budget("inv")
        await settle(deployment)
        ok = await procs[1].controller().acquire(request(tokens=100, budget="inv"))
        ok.release(success=True)
        with pytest.raises(AdmissionRejected) as over:
            await procs[0].controller().acquire(request(tokens=1, budget="inv"))
        assert over.value.reason == "tokens"

    run(deployment, scenario)


def test_a_second_admission_of_an_invocation_on_a_provider_is_retry_pressure(
    deployment: Deployment,
) -> None:
    """Each process's first admission of an invocation is decided the common way; the second on
    the same provider, from another process, is a repeat (one retry-pressure event), one on
    another provider is not, and forgetting the invocation forgets where it was admitted."""
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(providers={"llm": {"concurrency": 10}, "alt": {"concurrency": 10}}))
    events = deployment.key("pr:llm")

    async def scenario() -> None:
        first = await procs[0].controller().acquire(request(budget="inv"))
        assert first.evidence.retry_pressure == 0
        first.release(success=True)
        other = await procs[1].controller().acquire(request(provider="alt", budget="inv"))
        assert other.evidence.retry_pressure == 0
        other.release(success=True)
        await settle(deployment)
        assert deployment.client.llen(events) == 0
        again = await procs[1].controller().acquire(request(budget="inv"))
        again.release(success=True)
        await settle(deployment)
        assert deployment.client.llen(events) == 1
        assert deployment.client.exists(deployment.key("r:inv")) == 1
        procs[0].controller().release_budget("inv")
        await settle(deployment)
        assert deployment.client.exists(deployment.key("r:inv")) == 0
        fresh = await procs[0].controller().acquire(request(budget="inv"))
        fresh.release(success=True)
        await settle(deployment)
        assert deployment.client.llen(events) == 1

    run(deployment, scenario)


def test_a_finished_invocation_is_forgotten_with_the_next_call(deployment: Deployment) -> None:
    """`release_budget` costs no call of its own: the invocation's budgets and mark go with the
    workspace's next acquire (before it is decided, so the same process never sees them), or
    with the next batch of leases given back; another process sees them gone after that."""
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(principals={"alice": {"concurrency": 9, "maxAttempts": 1}}))
    budgets = [deployment.key(f"{kind}:inv-{n}") for n in (1, 2) for kind in ("b", "r")]

    async def scenario() -> None:
        first = await procs[0].controller().acquire(request(budget="inv-1"))
        first.release(success=True)
        await settle(deployment)
        assert deployment.client.exists(*budgets[:2]) == 2
        trips = dict(procs[0].coordinator.round_trips)
        procs[0].controller().release_budget("inv-1")
        # The same invocation at once, from the same process: forgotten first, so its one
        # attempt is there again, and it is a first admission (no retry pressure).
        again = await procs[0].controller().acquire(request(budget="inv-1"))
        assert again.evidence.retry_pressure == 0
        assert procs[0].coordinator.round_trips["acquire"] == trips["acquire"] + 1
        assert procs[0].coordinator.round_trips.get("release", 0) == trips.get("release", 0)
        # Without an acquire to take them along, a forget travels with the leases given back.
        again.release(success=True)
        procs[0].controller().release_budget("inv-1")
        second = await procs[1].controller().acquire(request(budget="inv-2"))
        second.release(success=True)
        procs[1].controller().release_budget("inv-2")
        await settle(deployment)
        assert deployment.client.exists(*budgets) == 0
        assert procs[0].coordinator.round_trips["release"] == trips.get("release", 0) + 1
        assert deployment.client.llen(deployment.key("pr:llm")) == 0
        # The other process finds the invocation's attempt budget whole again.
        third = await procs[1].controller().acquire(request(budget="inv-1"))
        third.release(success=True)

    run(deployment, scenario)


def test_request_bucket_defers_and_queue_timeout_refuses(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(
        profile(
            # The dwell outlasts the round trip budget (2 s): a request that a loaded machine
            # takes long to bring to Redis is still deferred there (and counted so) before its
            # dwell ends, not refused on arrival.
            providers={"llm": {"concurrency": 9, "requestsPerMinute": 2, "maxQueueWaitMs": 3_000}}
        )
    )

    async def scenario() -> None:
        for i in range(2):
            (await procs[i].controller().acquire(request(budget=f"b{i}"))).release(success=True)
        with pytest.raises(AdmissionRejected) as refused:
            await procs[0].controller().acquire(request(budget="b9"))
        assert refused.value.reason == "queue-timeout" and refused.value.retryable
        assert 1 <= refused.value.retry_after_ms <= 30_000
        await settle(deployment)
        assert deployment.queued("V:llm") == 0
        # Two minutes: the deferral was counted in this minute or, across its edge, the last.
        counts = (await procs[0].controller().state(minutes=2))["counts"]
        assert any("defer|requests-per-minute" in k for c in counts.values() for k in c)

    run(deployment, scenario)


def test_token_holder_is_not_starved_by_small_requests(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(3)]
    deployment.register(profile(providers={"llm": {"concurrency": 9, "tokensPerSecond": 100}}))

    async def scenario() -> None:
        # Every process has made a decision already (a first one also registers the process),
        # so the large request reaches Redis one round trip after the first has emptied the
        # bucket: the bucket refills in one second, and the large request must find it short.
        for index, process in enumerate(procs):
            warm = await process.controller().acquire(request(tokens=0, budget=f"warm-{index}"))
            warm.release(success=True)
        await settle(deployment)
        first = await procs[0].controller().acquire(request(tokens=100, budget="a"))
        first.release(success=True)
        large = asyncio.ensure_future(
            procs[1].controller().acquire(request(tokens=100, budget="b"))
        )
        await until(lambda: deployment.scope("V:llm").get("h") is not None)
        # Tokens come back meanwhile, but a small request must fit beside the holder's 100:
        # it waits.
        small = asyncio.ensure_future(
            procs[2].controller().acquire(request("bob", tokens=10, budget="c"))
        )
        order: list[str] = []
        large.add_done_callback(lambda _: order.append("large"))
        small.add_done_callback(lambda _: order.append("small"))
        lease = await asyncio.wait_for(large, 5)
        admitted = await asyncio.wait_for(small, 5)
        # The holder is admitted first; the small request waited behind it.
        assert order == ["large", "small"]
        assert admitted.evidence.queue_delay_ms > 0
        lease.release(success=True)
        admitted.release(success=True)

    run(deployment, scenario)


def test_queue_full_across_processes_with_a_hint(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(3)]
    deployment.register(
        profile(
            principals={"alice": {"concurrency": 1, "maxQueueLength": 1}, "bob": {"concurrency": 1}}
        )
    )

    async def scenario() -> None:
        held = await procs[0].controller().acquire(request())
        queued = asyncio.ensure_future(procs[1].controller().acquire(request()))
        await until(lambda: deployment.queued("P:alice") == 1)
        with pytest.raises(AdmissionRejected) as refused:
            await procs[2].controller().acquire(request())
        assert refused.value.reason == "queue-full"
        assert refused.value.evidence.active == 1 and refused.value.evidence.queued == 1
        held.release(success=True)
        (await asyncio.wait_for(queued, 5)).release(success=True)

    run(deployment, scenario)


def test_cancel_and_deadline_take_waiters_out_of_redis(deployment: Deployment) -> None:
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(workspace={"concurrency": 1}))

    async def scenario() -> None:
        # The waiting process has made a decision already (its first one also registers it and
        # installs the profile, which could outlast the short deadline below).
        (await procs[1].controller().acquire(request(budget="warm"))).release(success=True)
        await settle(deployment)
        held = await procs[0].controller().acquire(request())
        signal = CancelSignal()
        cancelled = asyncio.ensure_future(procs[1].controller().acquire(request(signal=signal)))
        # The deadline outlasts the round trip budget (2 s), so the waiter is queued in Redis
        # before it expires even when a loaded machine stalls the process or the cluster.
        clock = procs[1].registry.clock
        expiring = asyncio.ensure_future(
            procs[1].controller().acquire(request("bob", deadline_ms=clock.monotonic_ms() + 3_000))
        )
        await until(lambda: deployment.queued("W") == 2)
        signal.cancel()
        with pytest.raises(AdmissionRejected) as first:
            await cancelled
        assert first.value.reason == "cancelled"
        with pytest.raises(AdmissionRejected) as second:
            await expiring
        assert second.value.reason == "deadline-exceeded"
        await settle(deployment)
        assert deployment.queued("W") == 0
        assert deployment.client.hlen(deployment.key("W")) == 0
        held.release(success=True)

    run(deployment, scenario)


def test_local_refusals_cost_no_round_trip(deployment: Deployment) -> None:
    process = deployment.process(
        register=profile(principals={"alice": {"concurrency": 1, "maxRequestBytes": 10}})
    )

    async def scenario() -> None:
        await process.controller().acquire(request())  # binds the coordinator
        before = process.coordinator.round_trips["acquire"]
        for reason, item in (
            ("unconfigured-principal", request("mallory")),
            ("unconfigured-provider", request(provider="other")),
            ("invalid-estimate", request(tokens=-1)),
            ("request-too-large", request(request_bytes=11)),
        ):
            with pytest.raises(AdmissionRejected) as refused:
                await process.controller().acquire(item)
            assert refused.value.reason == reason
        assert process.coordinator.round_trips["acquire"] == before

    run(deployment, scenario)


def test_a_stale_process_never_admits_under_its_old_revision(deployment: Deployment) -> None:
    fresh = deployment.process(register=profile("v1"))
    stale = deployment.process()
    deployment.register(profile("v1"), stale)
    tighter = profile("v2", principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}})
    deployment.register(tighter, fresh)
    refreshed: list[str] = []

    async def refresh(workspace: str) -> None:
        refreshed.append(workspace)
        stale.registry.register(tighter, sequence=deployment.sequence)

    async def scenario() -> None:
        # Without a way to refresh, the stale process refuses instead of admitting under v1.
        with pytest.raises(AdmissionRejected) as refused:
            await stale.controller().acquire(request())
        assert refused.value.reason == "coordination-unavailable"
        stale.coordinator.on_stale = refresh
        lease = await stale.controller().acquire(request())
        assert refreshed and stale.controller().profile.profile_version == "v2"
        # v2 allows alice one permit: a second one waits.
        second = asyncio.ensure_future(fresh.controller().acquire(request()))
        await until(lambda: deployment.queued("P:alice") == 1)
        lease.release(success=True)
        (await asyncio.wait_for(second, 5)).release(success=True)

    run(deployment, scenario)


def test_a_newer_process_installs_its_revision(deployment: Deployment) -> None:
    old = deployment.process(register=profile("v1"))
    new = deployment.process()
    deployment.register(profile("v1"), new)
    deployment.register(profile("v2"), new)
    revision = deployment.client.hget(deployment.key("prof"), "rev")
    assert revision == "v2"

    async def scenario() -> None:
        with pytest.raises(AdmissionRejected):
            await old.controller().acquire(request())

    run(deployment, scenario)


def test_a_profile_with_ten_thousand_principals_is_installed_whole(
    deployment: Deployment,
) -> None:
    principals = {f"p{index}": {"concurrency": 1 + index % 3} for index in range(10_000)}
    process = deployment.process(register=profile(principals=principals))

    async def scenario() -> None:
        # The last principal's limit is there: a third permit of p9998 (concurrency 3) is
        # admitted, a second of p9997 (concurrency 2) is too, a third is not.
        held = [await process.controller().acquire(request("p9998")) for _ in range(3)]
        held += [await process.controller().acquire(request("p9997")) for _ in range(2)]
        with pytest.raises(AdmissionRejected):
            await process.controller().acquire(request("p9997", deadline_ms=50))
        for lease in held:
            lease.release(success=True)

    run(deployment, scenario)
    assert deployment.client.hlen(deployment.key("prof")) >= 10_003


def test_permits_of_a_dead_process_come_back_after_its_lease(deployment: Deployment) -> None:
    doomed = deployment.process(register=profile(workspace={"concurrency": 1}))
    survivor = deployment.process()
    deployment.register(profile(workspace={"concurrency": 1}), survivor)

    async def scenario() -> None:
        await doomed.controller().acquire(request())
        # The process dies: no release, no more heartbeats.
        for task in doomed.coordinator._tasks:
            task.cancel()
        started = time.monotonic()
        lease = await asyncio.wait_for(survivor.controller().acquire(request("bob")), 10)
        waited = time.monotonic() - started
        assert waited <= doomed.coordinator.settings.lease_ttl_ms / 1000 + 1.0
        assert lease.evidence.queue_delay_ms > 500
        lease.release(success=True)

    run(deployment, scenario)


def test_permits_a_dead_process_kept_in_the_earlier_layout_come_back(
    deployment: Deployment,
) -> None:
    """A process of the release before kept its leases in a hash of their own (`P:{ws}:L`): once
    it is dead, its permits go back like any dead process's."""
    doomed = deployment.process(register=profile(workspace={"concurrency": 1}))
    survivor = deployment.process()
    deployment.register(profile(workspace={"concurrency": 1}), survivor)

    async def scenario() -> None:
        held = await doomed.controller().acquire(request())
        for task in doomed.coordinator._tasks:
            task.cancel()
        # Where the earlier layout kept the lease.
        client = deployment.client
        text = client.hget(deployment.key("s"), "L" + held.id)
        assert text is not None
        client.hdel(deployment.key("s"), "L" + held.id)
        client.hset(deployment.key("L"), held.id, text)
        lease = await asyncio.wait_for(survivor.controller().acquire(request("bob")), 10)
        assert client.exists(deployment.key("L")) == 0
        lease.release(success=True)
        await settle(deployment)
        assert deployment.active("W") == 0

    run(deployment, scenario)


def test_idle_state_expires_and_nothing_grows(deployment: Deployment) -> None:
    deployment.settings = {"idle_ttl_ms": 300, "budget_ttl_ms": 300}
    process = deployment.process(
        register=profile(
            principals={"alice": {"concurrency": 5, "maxAttempts": 9}, "bob": {"concurrency": 5}},
            providers={"llm": {"concurrency": 5, "requestsPerMinute": 600}},
        )
    )

    async def scenario() -> None:
        for i in range(20):
            (await process.controller().acquire(request(budget=f"inv-{i}"))).release(success=True)
        await settle(deployment)
        client = deployment.client
        lasting = {"prof", "meta", "tot"}
        for key in deployment.stored_keys():
            suffix = key.rsplit("}:", 1)[-1] if "}:" in key else key.rsplit(":", 1)[-1]
            if suffix in lasting or key.endswith(":procs") or ":pw:" in key:
                continue
            ttl = client.pttl(key)
            if ttl == -2:
                # Expired between the listing and this read (budgets live 300 ms here).
                continue
            assert 0 < ttl <= 7_200_000, (key, ttl)
        await until(
            lambda: (
                not [
                    k
                    for k in deployment.stored_keys()
                    if ":b:" in k or ":r:" in k or k.endswith("}:s")
                ]
            ),
            timeout=5,
        )

    run(deployment, scenario)


def test_operators_read_the_shared_state_without_a_loop(deployment: Deployment) -> None:
    process = deployment.process(
        register=profile(providers={"llm": {"concurrency": 1, "maxQueueLength": 1}})
    )

    async def scenario() -> None:
        held = await process.controller().acquire(request())
        waiting = asyncio.ensure_future(process.controller().acquire(request("bob")))
        await until(lambda: deployment.queued("V:llm") == 1)
        with pytest.raises(AdmissionRejected):
            await process.controller().acquire(request("bob", budget="b2"))
        # Decisions are counted in the process and reported with the heartbeat or on settling.
        await settle(deployment)
        state = process.coordinator.state_sync(WORKSPACE, minutes=5)
        assert state["rev"] == "v1"
        assert state["providers"]["llm"]["a"] == 1 and state["providers"]["llm"]["q"] == 1
        assert state["leases"] == 1 and state["waiters"] == 1
        assert state["totals"]["llm|admit|admitted"] == 1
        assert state["totals"]["llm|reject|queue-full"] == 1
        assert sum(c.get("llm|defer|concurrency", 0) for c in state["counts"].values()) == 1
        held.release(success=True)
        (await asyncio.wait_for(waiting, 5)).release(success=True)

    run(deployment, scenario)


def test_totals_count_breaker_transitions_and_the_queue_delay(deployment: Deployment) -> None:
    process = deployment.process()
    breaker = {"failureThreshold": 1, "openMs": 200, "halfOpenMaxCalls": 1}
    deployment.register(profile(providers={"llm": {"concurrency": 1, "circuitBreaker": breaker}}))

    async def scenario() -> None:
        held = await process.controller().acquire(request())
        waiting = asyncio.ensure_future(process.controller().acquire(request("bob", budget="b")))
        await until(lambda: deployment.queued("V:llm") == 1)
        await asyncio.sleep(0.06)
        held.release(success=True)
        waited = await asyncio.wait_for(waiting, 5)
        waited.release(success=False)
        await settle(deployment)
        totals = process.coordinator.state_sync(WORKSPACE, minutes=2)["totals"]
        assert totals["llm|transition|closed>open"] == 1
        assert totals["llm|admit|admitted"] == 2
        # Two admissions, two delays: one instant, one that waited at least the 60 ms.
        assert totals["llm|delay|0"] == 1
        assert (
            sum(v for k, v in totals.items() if k.startswith("llm|delay|"))
            - totals["llm|delay|sum"]
            == 2
        )
        assert totals["llm|delay|sum"] >= 60
        assert waited.evidence.queue_delay_ms >= 60

    run(deployment, scenario)


def test_a_profile_naming_ten_thousand_principals_is_installed(deployment: Deployment) -> None:
    principals = {f"p-{index:05d}": {"concurrency": 1} for index in range(10_000)}
    process = deployment.process(register=profile(principals=principals))

    async def scenario() -> None:
        lease = await process.controller().acquire(request("p-09999"))
        lease.release(success=True)

    run(deployment, scenario)
    state = process.coordinator.state_sync(WORKSPACE)
    assert state["rev"] == "v1" and state["principals"] == 10_000


def test_degraded_mode_divides_each_limit_by_the_live_processes(
    private_redis: PrivateRedis,
) -> None:
    deployment = Deployment(private_redis.url, settings={"on_failure": "degraded"})
    limits = {
        "workspace": {"concurrency": 4},
        "providers": {"llm": {"concurrency": 4}},
        "principals": {"alice": {"concurrency": 4}, "bob": {"concurrency": 4}},
    }
    procs = [deployment.process() for _ in range(2)]
    deployment.register(profile(**limits))

    async def scenario() -> None:
        for process in procs:
            (await process.controller().acquire(request())).release(success=True)
        await until(lambda: all(p.coordinator.live_processes == 2 for p in procs))
        await settle(deployment)
        private_redis.stop()
        clock = procs[0].registry.clock
        # Without Redis each process admits under half of every limit: two permits, not four.
        held = [await procs[0].controller().acquire(request(budget=f"d{i}")) for i in range(2)]
        assert all(lease.evidence.active <= 2 for lease in held)
        with pytest.raises(AdmissionRejected) as refused:
            await (
                procs[0]
                .controller()
                .acquire(request(budget="d3", deadline_ms=clock.monotonic_ms() + 200))
            )
        assert refused.value.reason == "deadline-exceeded"
        other = await procs[1].controller().acquire(request(budget="d4"))
        for lease in (*held, other):
            lease.release(success=True)

    run(deployment, scenario)


def test_fail_closed_refuses_while_redis_is_down_and_resumes(
    private_redis: PrivateRedis,
) -> None:
    deployment = Deployment(private_redis.url)
    process = deployment.process(register=profile())

    async def scenario() -> None:
        (await process.controller().acquire(request())).release(success=True)
        await settle(deployment)
        private_redis.stop()
        with pytest.raises(AdmissionRejected) as refused:
            await process.controller().acquire(request(budget="down"))
        assert refused.value.reason == "coordination-unavailable"
        assert refused.value.retryable and 1 <= refused.value.retry_after_ms <= 30_000
        private_redis.start()
        # The restarted Redis is empty: the profile goes back in, and admission resumes.
        lease = await process.controller().acquire(request(budget="up"))
        lease.release(success=True)

    run(deployment, scenario)


def test_a_forget_carried_by_an_acquire_that_fails_still_lands(
    private_redis: PrivateRedis,
) -> None:
    """The end of an invocation rides on the next acquire; when Redis holds that acquire back
    until it times out (`coordination-unavailable`) and then drops it, the forget is sent again
    with the release calls, retried until Redis answers: the invocation's budgets and mark go
    all the same."""
    deployment = Deployment(private_redis.url)
    process = deployment.process(
        register=profile(principals={"alice": {"concurrency": 9, "maxAttempts": 1}}),
        timeout_ms=300,
    )

    async def scenario() -> None:
        done = await process.controller().acquire(request(budget="done"))
        done.release(success=True)
        await settle(deployment)
        assert deployment.client.exists(deployment.key("b:done")) == 1
        assert deployment.client.exists(deployment.key("r:done")) == 1
        process.controller().release_budget("done")
        # Writes wait (a function that writes among them) and reads go on; a call whose caller
        # gave up on it is never run.
        deployment.client.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
        with pytest.raises(AdmissionRejected) as refused:
            await process.controller().acquire(request(budget="during"))
        assert refused.value.reason == "coordination-unavailable"
        assert deployment.client.exists(deployment.key("b:done")) == 1
        await until(lambda: deployment.client.exists(deployment.key("b:done")) == 0)
        assert deployment.client.exists(deployment.key("r:done")) == 0
        # Its one attempt is whole again.
        again = await process.controller().acquire(request(budget="done"))
        again.release(success=True)

    run(deployment, scenario)


def test_closing_never_waits_on_a_write_forever(deployment: Deployment) -> None:
    process = deployment.process(register=profile(), timeout_ms=200)

    async def scenario() -> None:
        (await process.controller().acquire(request())).release(success=True)
        stuck = asyncio.Event()
        process.coordinator.background(stuck.wait())
        started = time.monotonic()
        await process.coordinator.aclose()
        # Bounded by the close grace (four call timeouts, at least a second), not by the write.
        assert time.monotonic() - started < 3.0

    run(deployment, scenario)


def test_a_closed_coordinator_takes_no_more_writes_and_closes_again_on_another_loop(
    deployment: Deployment,
) -> None:
    process = deployment.process(register=profile())

    async def scenario() -> None:
        (await process.controller().acquire(request())).release(success=True)
        await process.coordinator.aclose()
        # A write asked of it afterwards (a lease given back late) has no client to go through:
        # it is dropped, never left as a task its loop may close over.
        late = asyncio.Event()
        assert process.coordinator.background(late.wait()) is None

    run(deployment, scenario)

    async def nothing() -> None:
        return None

    # `run` closes every coordinator of the deployment again, this time on a loop of its own.
    run(deployment, nothing)
    assert process.coordinator.background(asyncio.sleep(0)) is None


def test_operators_count_the_live_processes_without_a_loop(deployment: Deployment) -> None:
    processes = [deployment.process(register=profile()) for _ in range(2)]

    async def scenario() -> None:
        for process in processes:
            (await process.controller().acquire(request())).release(success=True)
        await settle(deployment)
        assert [p.coordinator.live_processes_sync() for p in processes] == [2, 2]
        # One stops renewing: it is counted until its lease lapses (3 s), then no more.
        await processes[1].coordinator.aclose()
        await until(lambda: processes[0].coordinator.live_processes_sync() == 1, timeout=15)

    run(deployment, scenario)


def test_a_process_stops_renewing_where_it_has_long_been_idle(deployment: Deployment) -> None:
    # A lease of two seconds: the holder must renew within it throughout, which a loaded CI
    # machine that stalls the process for a few hundred milliseconds must not prevent.
    deployment.settings = {"lease_ttl_ms": 2_000, "heartbeat_ms": 100}
    holder = deployment.process(register=profile())
    idle = deployment.process(register=profile())
    procs = deployment.key("procs")

    def registered(process: Process) -> bool:
        return deployment.client.zscore(procs, process.coordinator.process_id) is not None

    async def scenario() -> None:
        held = await holder.controller().acquire(request())
        (await idle.controller().acquire(request("bob"))).release(success=True)
        await settle(deployment)
        assert registered(idle) and registered(holder)
        # Idle here for a lease TTL, the process stops renewing; its lapsed lease is reaped by
        # the holder's heartbeat. The holder, whose permit is out, keeps renewing throughout.
        await until(lambda: not registered(idle), timeout=15)
        # One more lease TTL: a holder that had stopped renewing would have lapsed by now.
        await asyncio.sleep(2.0)
        assert registered(holder)
        assert deployment.active("W") == 1
        # Its next decision here registers it again.
        again = await idle.controller().acquire(request("bob", budget="inv-2"))
        assert registered(idle)
        assert deployment.active("W") == 2
        again.release(success=True)
        held.release(success=True)
        await settle(deployment)

    run(deployment, scenario)


def test_settling_waits_for_the_counts_a_heartbeat_carries(deployment: Deployment) -> None:
    process = deployment.process(register=profile())
    coordinator = process.coordinator
    real_call = coordinator._heartbeat_call
    carrying = asyncio.Event()
    gate = asyncio.Event()

    async def held_call(beat: Any) -> Any:
        if any(beat.counts.values()):
            carrying.set()
            await gate.wait()
        return await real_call(beat)

    async def scenario() -> None:
        coordinator._heartbeat_call = held_call  # type: ignore[method-assign]
        (await process.controller().acquire(request())).release(success=True)
        # The next heartbeat takes this process's counts and is held on its way to Redis.
        await asyncio.wait_for(carrying.wait(), 10)
        assert not coordinator.local_counts
        settling = asyncio.ensure_future(coordinator.settle())
        await asyncio.sleep(0.3)
        assert not settling.done()
        gate.set()
        await asyncio.wait_for(settling, 10)
        counts = (await process.controller().state(minutes=2))["counts"]
        assert any("admit|admitted" in label for c in counts.values() for label in c)

    run(deployment, scenario)
