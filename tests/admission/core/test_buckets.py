"""Token and request buckets refill at their rate, up to their capacity, to the millisecond."""

from __future__ import annotations

import asyncio

import pytest

from .conftest import make_profile, request


def _tokens_per_second(tps: int):
    return make_profile(providers={"llm": {"concurrency": 10, "tokensPerSecond": tps}})


async def _admitted_at(s, budget: str, tokens: int) -> float:
    lease = await s.admit(request(budget=budget, tokens=tokens))
    lease.release()
    return s.now()


def test_queued_requests_are_admitted_as_the_token_bucket_refills(scenario_factory):
    # 2000 tokens a second: two tokens a millisecond, one token every half millisecond.
    s = scenario_factory(_tokens_per_second(2000))

    async def body(s):
        await _admitted_at(s, "drain", 2000)
        waiting = [asyncio.ensure_future(_admitted_at(s, f"w{i}", 1)) for i in range(3)]
        return await asyncio.gather(*waiting)

    assert s.run(body) == [0.5, 1.0, 1.5]


def test_an_idle_token_bucket_fills_to_its_capacity_and_no_further(scenario_factory):
    s = scenario_factory(_tokens_per_second(1000))

    async def body(s):
        await _admitted_at(s, "first", 0)
        # Ten idle seconds would refill 10 000 tokens; the bucket holds 1000.
        await asyncio.sleep(10)
        full = await _admitted_at(s, "burst", 1000)
        after = await _admitted_at(s, "next", 1)
        return after - full

    assert s.run(body) == 1.0


def test_a_request_bucket_refills_one_request_per_interval(scenario_factory):
    # Six a minute: the bucket holds six and refills one every ten seconds.
    s = scenario_factory(
        make_profile(providers={"llm": {"concurrency": 10, "requestsPerMinute": 6}})
    )

    async def body(s):
        waiting = [asyncio.ensure_future(_admitted_at(s, f"r{i}", 0)) for i in range(8)]
        return await asyncio.gather(*waiting)

    assert s.run(body) == [0.0] * 6 + [10_000.0, 20_000.0]


def test_a_profile_change_refills_the_buckets_at_the_new_rates(scenario_factory):
    def profile(version: str, rpm: int, tps: int):
        providers = {
            "paced": {"concurrency": 100, "requestsPerMinute": rpm},
            "metered": {"concurrency": 100, "tokensPerSecond": tps},
        }
        return make_profile(version=version, providers=providers)

    s = scenario_factory(profile("v1", 60, 1000))

    async def call(budget: str, provider: str, tokens: int) -> float:
        lease = await s.admit(request(provider=provider, budget=budget, tokens=tokens))
        lease.release()
        return s.now()

    async def body(s):
        # Empty both buckets under v1, then double both rates.
        for i in range(60):
            await call(f"r{i}", "paced", 0)
        await call("t0", "metered", 1000)
        s.registry.register(profile("v2", 120, 2000))
        # Two requests a second: the next one is back after half a second; 600 tokens come
        # back in 300 ms at two a millisecond.
        return await asyncio.gather(call("r", "paced", 0), call("t", "metered", 600))

    assert s.run(body) == [pytest.approx(500, abs=1e-6), pytest.approx(300, abs=1e-6)]


def test_bucket_waits_are_reported_as_defers_naming_the_bucket(scenario_factory):
    s = scenario_factory(
        make_profile(
            providers={
                "paced": {"concurrency": 10, "requestsPerMinute": 1},
                "metered": {"concurrency": 10, "tokensPerSecond": 10},
            }
        )
    )
    defers: list[str] = []
    s.registry.on_decision(
        lambda event: defers.append(event.reason) if event.decision == "defer" else None
    )

    async def body(s):
        # Each second call finds its bucket empty and waits for it.
        for budget, provider, tokens in [("t1", "metered", 10), ("t2", "metered", 10)]:
            (await s.admit(request(provider=provider, budget=budget, tokens=tokens))).release()
        for budget, provider in [("p1", "paced"), ("p2", "paced")]:
            (await s.admit(request(provider=provider, budget=budget))).release()

    s.run(body)
    assert defers == ["tokens-per-second", "requests-per-minute"]


def test_an_unknown_token_estimate_passes_an_empty_token_bucket(scenario_factory):
    s = scenario_factory(_tokens_per_second(1000))

    async def body(s):
        await _admitted_at(s, "drain", 1000)
        lease = await s.admit(request(budget="unknown"))
        lease.release()
        unknown_at = s.now()
        # It took nothing from the bucket either: one token is back after one millisecond.
        return unknown_at, await _admitted_at(s, "one", 1)

    assert s.run(body) == (0.0, 1.0)
