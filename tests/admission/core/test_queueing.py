"""CNC-ADMIT-011..014, 019..021: queues, expiry, deadlines, cancellation, fairness, evidence."""

from __future__ import annotations

import asyncio
import json

import pytest

from admission.core import AdmissionRegistry, CancelSignal, SystemClock, VirtualTimeLoop

from .conftest import WORKSPACE, make_profile, rejection_of, request


def test_CNC_ADMIT_011_queue_full_is_retryable_with_jittered_hint(scenario_factory):
    profile = make_profile(
        principals={"alice": {"concurrency": 1, "maxQueueLength": 2, "maxQueueWaitMs": 4000}},
    )
    s = scenario_factory(profile)

    async def body(s):
        holder = await s.admit(request(budget="h"))
        waiting = [s.start(request(budget=f"w{i}")) for i in range(2)]
        await s.settle()
        hints = set()
        for i in range(20):
            error = await s.reject(request(budget=f"x{i}"))
            assert error.reason == "queue-full" and error.retryable
            assert 1 <= error.retry_after_ms <= 30_000
            assert error.evidence.retry_after_ms == error.retry_after_ms
            assert error.evidence.queued == 2
            hints.add(error.retry_after_ms)
        assert len(hints) > 5  # real jitter: rejected callers do not return in lockstep
        assert all(1000 <= hint <= 3000 for hint in hints)  # 0.5x..1.5x of half the dwell bound
        assert s.controller.snapshot("alice") == (1, 2)
        holder.release()
        await s.settle()
        waiting[0].result().release()
        await s.settle()
        waiting[1].result().release()

    s.run(body)


def test_CNC_ADMIT_011_workspace_and_provider_queue_bounds(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1, "maxQueueLength": 1},
            providers={"llm": {"concurrency": 5, "maxQueueLength": 5}},
        )
    )

    async def body(s):
        holder = await s.admit(request("alice"))
        queued = s.start(request("bob"))
        await s.settle()
        assert (await s.reject(request("alice", budget="z"))).reason == "queue-full"
        holder.release()
        await s.settle()
        queued.result().release()

    s.run(body)


def test_CNC_ADMIT_012_offline_slow_client_waiters_expire_at_own_dwell(scenario_factory):
    profile = make_profile(
        principals={"alice": {"concurrency": 1, "maxQueueLength": 3, "maxQueueWaitMs": 1000}},
    )
    s = scenario_factory(profile)

    async def body(s):
        holder = await s.admit(request(budget="h"))
        first = s.start(request(budget="a"))
        await asyncio.sleep(0.4)
        second = s.start(request(budget="b"))
        third = s.start(request(budget="c"))
        await s.settle()
        assert s.controller.snapshot("alice").queued == 3
        assert (await s.reject(request(budget="d"))).reason == "queue-full"
        await asyncio.sleep(0.6)
        await s.settle()
        error = rejection_of(first)
        assert error.reason == "queue-timeout" and error.retryable
        assert error.evidence.queue_delay_ms == pytest.approx(1000)
        # The expired waiter stopped counting at once: there is room for a new one.
        assert s.controller.snapshot("alice").queued == 2
        late = s.start(request(budget="e"))
        await asyncio.sleep(0.4)
        await s.settle()
        # Waiters behind the head expire at their own bound, not when they reach the head.
        assert rejection_of(second).reason == "queue-timeout"
        assert rejection_of(third).reason == "queue-timeout"
        assert not late.done()
        holder.release()
        await s.settle()
        late.result().release()
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_013_deadlines_at_acquire_and_while_queued(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))

    async def body(s):
        error = await s.reject(request(deadline_ms=s.now()))
        assert error.reason == "deadline-exceeded" and not error.retryable
        holder = await s.admit(request(budget="h"))
        waiting = s.start(request(budget="w", deadline_ms=s.now() + 250))
        await asyncio.sleep(0.25)
        await s.settle()
        error = rejection_of(waiting)
        assert error.reason == "deadline-exceeded"
        assert error.evidence.queue_delay_ms == pytest.approx(250)
        assert s.controller.snapshot("alice") == (1, 0)
        holder.release()

    s.run(body)


def test_CNC_ADMIT_014_cancellation_before_while_queued_and_at_admission(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))

    async def body(s):
        fired = CancelSignal()
        fired.cancel("caller")
        assert (await s.reject(request(signal=fired))).reason == "cancelled"

        holder = await s.admit(request(budget="h"))
        signal = CancelSignal()
        waiting = s.start(request(budget="w", signal=signal))
        behind = s.start(request(budget="b"))
        await s.settle()
        signal.cancel("caller")
        await s.settle()
        error = rejection_of(waiting)
        assert error.reason == "cancelled" and not error.retryable
        assert s.controller.snapshot("alice") == (1, 1)

        # The waiting task is cancelled in the same step that admits it: the permit comes back.
        holder.release()
        assert behind.done() is False  # admitted, but the task has not resumed yet
        behind.cancel()
        await s.settle()
        assert behind.cancelled()
        assert s.controller.snapshot("alice") == (0, 0)

        # A task cancelled while queued leaves the queue at once.
        holder = await s.admit(request(budget="h2"))
        queued = s.start(request(budget="q"))
        await s.settle()
        queued.cancel()
        await s.settle()
        assert s.controller.snapshot("alice") == (1, 0)
        holder.release()

    s.run(body)


def test_CNC_ADMIT_019_round_robin_keeps_quiet_principal_served(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            principals={"noisy": {"concurrency": 10}, "quiet": {"concurrency": 10}},
        )
    )

    async def body(s):
        order: list[str] = []

        async def call(principal: str, budget: str) -> None:
            lease = await s.controller.acquire(request(principal, budget=budget))
            order.append(principal)
            await asyncio.sleep(0.01)
            lease.release()

        noisy = [s.loop.create_task(call("noisy", f"n{i}")) for i in range(20)]
        await asyncio.sleep(0.001)
        quiet = [s.loop.create_task(call("quiet", f"q{i}")) for i in range(3)]
        await asyncio.gather(*noisy, *quiet)
        # The first noisy call is already running, then lanes alternate until quiet is done.
        assert order[:7] == ["noisy", "noisy", "quiet", "noisy", "quiet", "noisy", "quiet"]

    s.run(body)


def test_CNC_ADMIT_019_lanes_appearing_and_disappearing_stay_fair(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            principals={p: {"concurrency": 5} for p in ("a", "b", "c")},
        )
    )

    async def body(s):
        served: list[tuple[str, float]] = []

        async def call(principal: str, budget: str) -> None:
            lease = await s.controller.acquire(request(principal, budget=budget))
            served.append((principal, s.now()))
            await asyncio.sleep(0.01)
            lease.release()

        tasks = [s.loop.create_task(call("a", f"a{i}")) for i in range(6)]
        tasks += [s.loop.create_task(call("b", "b0"))]
        await asyncio.sleep(0.015)
        # Lane b is served at 20 ms and goes; c appears at 15 ms. At 30 ms c has never been served
        # and a was served at 10 ms, so c goes first; from then on a and c alternate.
        tasks += [s.loop.create_task(call("c", f"c{i}")) for i in range(2)]
        await asyncio.gather(*tasks)
        assert served == [
            ("a", 0.0),
            ("a", 10.0),
            ("b", 20.0),
            ("c", 30.0),
            ("a", 40.0),
            ("c", 50.0),
            ("a", 60.0),
            ("a", 70.0),
            ("a", 80.0),
        ]

    s.run(body)


def test_CNC_ADMIT_020_evidence_counts_other_waiters_and_carries_no_identity(scenario_factory):
    s = scenario_factory(
        make_profile(
            principals={"principal-secret": {"concurrency": 1}, "bob": {"concurrency": 1}},
        )
    )

    async def body(s):
        holder = await s.admit(request("principal-secret", budget="h", tokens=5, cost_usd=0.25))
        assert holder.evidence.active == 1 and holder.evidence.queued == 0
        assert holder.evidence.estimated_tokens == 5
        assert holder.evidence.estimated_cost_usd == 0.25
        waiters = [s.start(request("principal-secret", budget=f"w{i}")) for i in range(3)]
        await s.settle()
        assert s.controller.snapshot("principal-secret").queued == 3
        holder.release()
        await s.settle()
        lease = waiters[0].result()
        assert lease.evidence.queued == 2 and lease.evidence.active == 1
        text = json.dumps(lease.evidence.to_dict())
        assert "principal-secret" not in text and WORKSPACE not in text
        assert set(lease.evidence.to_dict()) == {
            "decision",
            "reason",
            "queueDelayMs",
            "active",
            "queued",
            "estimatedTokens",
            "estimatedCostUsd",
            "retryPressure",
            "breakerState",
        }
        for task in waiters[1:]:
            task.cancel()
        lease.release()

    s.run(body)


def test_CNC_ADMIT_020_retry_pressure_is_a_recent_window(scenario_factory):
    s = scenario_factory()

    async def body(s):
        for _ in range(3):
            (await s.admit(request(budget="inv"))).release(success=False)
        lease = await s.admit(request(budget="inv"))
        assert lease.evidence.retry_pressure == 3  # three repeated attempts of one budget id
        lease.release(retry_after_ms=10)
        assert (await s.admit(request(budget="other"))).evidence.retry_pressure == 4
        await asyncio.sleep(61)
        lease = await s.admit(request(budget="other2"))
        assert lease.evidence.retry_pressure == 0
        lease.release()

    s.run(body)


def test_CNC_ADMIT_021_unconfigured_scopes_and_host_bugs(scenario_factory):
    s = scenario_factory()

    async def body(s):
        assert (await s.reject(request("mallory"))).reason == "unconfigured-principal"
        assert (await s.reject(request("mallory", "nowhere"))).reason == "unconfigured-principal"
        error = await s.reject(request("alice", "nowhere"))
        assert error.reason == "unconfigured-provider" and not error.retryable
        with pytest.raises(ValueError):
            await s.controller.acquire(request(workspace="another-workspace"))

    s.run(body)


def test_CNC_ADMIT_021_one_clock_per_registry():
    registry = AdmissionRegistry(clock=SystemClock())
    controller = registry.register(make_profile())
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(RuntimeError, match="clock"):
            loop.run_until_complete(controller.acquire(request()))
    finally:
        loop.close()

    async def on_real_loop():
        lease = await controller.acquire(request())
        lease.release()
        return lease.evidence.decision

    assert asyncio.run(on_real_loop()) == "admit"
