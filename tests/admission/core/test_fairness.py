"""CNC-ADMIT-RESERVE-*, CNC-ADMIT-SHARE-*, CNC-ADMIT-TOKEN-001: reservations, share caps, tokens."""

from __future__ import annotations

import asyncio

import pytest

from admission.core import InvalidProfileError, Profile

from .conftest import make_profile, profile_doc, request


def test_CNC_ADMIT_RESERVE_001_unused_reservations_are_held_back(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 3},
            principals={
                "noisy": {"concurrency": 10},
                "quiet": {"concurrency": 2, "reservedConcurrency": 1},
            },
        )
    )

    async def body(s):
        first = await s.admit(request("noisy", budget="a"))
        second = await s.admit(request("noisy", budget="b"))
        third = s.start(request("noisy", budget="c"))
        await s.settle()
        assert not third.done()  # the third permit is quiet's reservation
        quiet = await s.admit(request("quiet", budget="q"))
        assert quiet.evidence.queue_delay_ms == 0
        first.release()
        await s.settle()
        # Quiet now uses its reservation, so the freed permit is noisy's again.
        assert third.done()
        for lease in (second, third.result(), quiet):
            lease.release()

    s.run(body)


def test_CNC_ADMIT_RESERVE_002_inside_its_reservation_a_principal_needs_one_permit(
    scenario_factory,
):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 2},
            principals={
                "noisy": {"concurrency": 10},
                "quiet": {"concurrency": 2, "reservedConcurrency": 2},
            },
        )
    )

    async def body(s):
        # Everything is reserved for quiet: noisy waits, quiet goes straight in.
        noisy = s.start(request("noisy", budget="n"))
        await s.settle()
        assert not noisy.done()
        q1 = await s.admit(request("quiet", budget="q1"))
        q2 = await s.admit(request("quiet", budget="q2"))
        q1.release()
        await s.settle()
        assert not noisy.done()
        q2.release()
        await s.settle()
        assert not noisy.done()  # both permits are still reserved and unused
        noisy.cancel()

    s.run(body)


def test_CNC_ADMIT_RESERVE_002_reservations_beyond_a_pool_are_refused():
    with pytest.raises(InvalidProfileError, match="concurrency"):
        Profile.from_dict(
            profile_doc(
                workspace={"concurrency": 2},
                principals={
                    "a": {"concurrency": 2, "reservedConcurrency": 2},
                    "b": {"concurrency": 1, "reservedConcurrency": 1},
                },
            ),
            workspace_id="ws",
        )


def test_CNC_ADMIT_SHARE_001_share_cap_bounds_active_permits(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 4, "maxPrincipalShare": 0.5},
            principals={"noisy": {"concurrency": 10}, "quiet": {"concurrency": 10}},
        )
    )

    async def body(s):
        leases = [await s.admit(request("noisy", budget=f"n{i}")) for i in range(2)]
        capped = s.start(request("noisy", budget="n3"))
        await s.settle()
        assert not capped.done()  # floor(0.5 * 4) = 2 permits for one principal
        quiet = [await s.admit(request("quiet", budget=f"q{i}")) for i in range(2)]
        leases[0].release()
        await s.settle()
        assert capped.done()
        for lease in [leases[1], capped.result(), *quiet]:
            lease.release()

    s.run(body)


@pytest.mark.parametrize("pool", ["workspace", "provider"])
@pytest.mark.parametrize(("concurrency", "share", "cap"), [(4, 0.5, 2), (3, 0.5, 1), (5, 0.1, 1)])
def test_CNC_ADMIT_SHARE_001_share_cap_is_exact(scenario_factory, pool, concurrency, share, cap):
    # One principal holds at most max(1, floor(share x concurrency)) of a pool's permits.
    limits = {"concurrency": concurrency, "maxPrincipalShare": share}
    pools = {"workspace": limits} if pool == "workspace" else {"providers": {"llm": limits}}
    s = scenario_factory(
        make_profile(
            **pools,
            principals={"noisy": {"concurrency": 10}, "quiet": {"concurrency": 10}},
        )
    )

    async def body(s):
        leases = [await s.admit(request("noisy", budget=f"n{i}")) for i in range(cap)]
        capped = s.start(request("noisy", budget="over"))
        await s.settle()
        assert not capped.done()
        assert s.controller.snapshot("noisy").active == cap
        # The pool still has permits for another principal.
        other = await s.admit(request("quiet", budget="q"))
        leases[0].release()
        await s.settle()
        assert capped.done() and s.controller.snapshot("noisy").active == cap
        for lease in [*leases[1:], capped.result(), other]:
            lease.release()

    s.run(body)


def test_CNC_ADMIT_SHARE_002_queue_share_rejects_only_the_noisy_principal(scenario_factory):
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            providers={"llm": {"concurrency": 1, "maxQueueLength": 4, "maxPrincipalShare": 0.5}},
            principals={"noisy": {"concurrency": 10}, "quiet": {"concurrency": 10}},
        )
    )

    async def body(s):
        holder = await s.admit(request("noisy", budget="h"))
        queued = [s.start(request("noisy", budget=f"n{i}")) for i in range(2)]
        await s.settle()
        error = await s.reject(request("noisy", budget="n-over"))
        assert error.reason == "queue-full" and error.retryable
        quiet = [s.start(request("quiet", budget=f"q{i}")) for i in range(2)]
        await s.settle()
        assert not any(t.done() for t in quiet)
        assert s.controller.snapshot("quiet").queued == 2
        holder.release()
        for _ in range(4):
            await s.settle()
            for task in [*queued, *quiet]:
                if task.done() and not task.result().released:
                    task.result().release()
        assert all(t.done() and t.exception() is None for t in [*queued, *quiet])

    s.run(body)


def test_CNC_ADMIT_SHARE_002_a_queue_share_below_two_waiters_is_one(scenario_factory):
    # max(1, floor(0.5 x 3)) = 1: one waiter per principal in this pool's queue.
    s = scenario_factory(
        make_profile(
            workspace={"concurrency": 1},
            providers={"llm": {"concurrency": 1, "maxQueueLength": 3, "maxPrincipalShare": 0.5}},
            principals={"noisy": {"concurrency": 10}, "quiet": {"concurrency": 10}},
        )
    )

    async def body(s):
        holder = await s.admit(request("noisy", budget="h"))
        waiting = s.start(request("noisy", budget="w"))
        await s.settle()
        error = await s.reject(request("noisy", budget="over"))
        assert error.reason == "queue-full"
        quiet = s.start(request("quiet", budget="q"))
        await s.settle()
        assert not quiet.done() and s.controller.snapshot("quiet").queued == 1
        holder.release()
        for _ in range(3):
            await s.settle()
            for task in (waiting, quiet):
                if task.done() and not task.result().released:
                    task.result().release()
        assert waiting.done() and quiet.done()

    s.run(body)


def test_CNC_ADMIT_TOKEN_001_large_request_is_not_starved_by_small_ones(scenario_factory):
    s = scenario_factory(
        make_profile(
            providers={"llm": {"concurrency": 100, "tokensPerSecond": 1000}},
            principals={"big": {"concurrency": 10}, "small": {"concurrency": 10}},
        )
    )

    async def body(s):
        drain = await s.admit(request("small", budget="drain", tokens=900))
        drain.release()
        big = s.start(request("big", budget="big", tokens=1000))
        await s.settle()
        assert not big.done()
        admitted_small = []

        async def small_stream():
            for i in range(100):
                lease = await s.controller.acquire(request("small", budget=f"s{i}", tokens=50))
                admitted_small.append(s.now())
                lease.release()
                await asyncio.sleep(0.05)

        stream = s.loop.create_task(small_stream())
        lease = await big
        # The big request waited only for its own refill (900 ms), not behind the small stream.
        assert s.now() == pytest.approx(900, abs=1)
        assert lease.evidence.queue_delay_ms == pytest.approx(900, abs=1)
        lease.release()
        await asyncio.sleep(0.175)
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
        # No small request went in beside the reservation; the first one waited for the holder
        # and then for its own 50 tokens to refill (50 ms), then one every 50 ms.
        assert admitted_small == pytest.approx([950, 1000, 1050])

    s.run(body)


def _three_permits_one_reserved(scenario_factory, pool):
    """Three permits in the `pool` (workspace or provider), one of them quiet's reservation."""
    three = {"concurrency": 3}
    return scenario_factory(
        make_profile(
            workspace=three if pool == "workspace" else {"concurrency": 10},
            providers={"llm": three if pool == "provider" else {"concurrency": 10}},
            principals={
                "noisy": {"concurrency": 10},
                "quiet": {"concurrency": 2, "reservedConcurrency": 1},
            },
        )
    )


async def _noisy_asks_for_three(s):
    """Noisy's queue delays for the two permits it gets, and whether its third request waits."""
    held = [await s.admit(request("noisy", budget=f"n{i}")) for i in range(2)]
    third = s.start(request("noisy", budget="n2"))
    await s.settle()
    waiting = not third.done()
    third.cancel()
    for lease in held:
        lease.release()
    return [lease.evidence.queue_delay_ms for lease in held], waiting


@pytest.mark.parametrize("pool", ["workspace", "provider"])
def test_CNC_ADMIT_RESERVE_001_every_unreserved_permit_is_usable_at_once(scenario_factory, pool):
    # Three permits in the pool, one of them quiet's unused reservation: noisy gets two at once.
    s = _three_permits_one_reserved(scenario_factory, pool)
    assert s.run(_noisy_asks_for_three) == ([0, 0], True)


@pytest.mark.parametrize("pool", ["workspace", "provider"])
def test_CNC_ADMIT_RESERVE_001_a_reservation_given_back_is_held_back_again(scenario_factory, pool):
    s = _three_permits_one_reserved(scenario_factory, pool)

    async def body(s):
        (await s.admit(request("quiet", budget="q"))).release()
        return await _noisy_asks_for_three(s)

    # Quiet's permit is unused again, so noisy still gets two of the three.
    assert s.run(body) == ([0, 0], True)
