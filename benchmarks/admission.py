"""Admission hot-path benchmark: acquire+release round trips, contention by other lanes, memory.

Run with `python benchmarks/admission.py` (or `make bench`). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from admission.core import (
    AdmissionRegistry,
    AdmissionRequest,
    Estimate,
    Profile,
)

WORKSPACE = "bench"
PROVIDER_LIMITS = {
    "concurrency": 1_000_000,
    "requestsPerMinute": 1e12,
    "tokensPerSecond": 1e12,
    "maxQueueLength": 1_000_000,
    "maxQueueWaitMs": 3_600_000,
    "maxPrincipalShare": 1.0,
    "circuitBreaker": {"failureThreshold": 5, "openMs": 1000, "halfOpenMaxCalls": 1},
}


def profile(principals: int, *, budgets: bool) -> Profile:
    principal_limits = {"concurrency": 1, "requestsPerMinute": 1e12, "tokensPerSecond": 1e12}
    workspace = {"concurrency": 1_000_000, "maxQueueLength": 1_000_000}
    if budgets:
        workspace.update(maxCostUsd=1e12, maxAttempts=1_000_000, maxRetainedWork=100)
    doc = {
        "profileVersion": "bench",
        "workspace": workspace,
        "providers": {"llm": PROVIDER_LIMITS},
        "principals": {"hot": {**principal_limits, "concurrency": 8}}
        | {f"p{i}": principal_limits for i in range(principals)},
    }
    return Profile.from_dict(doc, workspace_id=WORKSPACE)


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


async def round_trips(controller, iterations: int, *, budgets: bool) -> list[int]:
    estimate = (
        Estimate(tokens=200, cost_usd=0.001, retained_work=1) if budgets else Estimate(tokens=200)
    )
    requests = [
        AdmissionRequest(f"inv-{i}", "hot", WORKSPACE, "llm", estimate) for i in range(iterations)
    ]
    samples = [0] * iterations
    clock = time.perf_counter_ns
    acquire = controller.acquire
    release_budget = controller.release_budget
    gc.collect()
    gc.disable()
    try:
        for i, request in enumerate(requests):
            start = clock()
            lease = await acquire(request)
            lease.release(success=True)
            if budgets:
                release_budget(request.budget_id)
            samples[i] = clock() - start
    finally:
        gc.enable()
    return samples


def report(label: str, samples: list[int]) -> float:
    ordered = sorted(samples)
    total_s = sum(samples) / 1e9
    p50 = percentile(ordered, 0.50)
    print(
        f"{label:<46} {len(samples) / total_s:>10,.0f} round trips/s   "
        f"p50 {p50:6.2f} µs   p99 {percentile(ordered, 0.99):6.2f} µs"
    )
    return p50


async def contended(iterations: int, lanes: int, *, budgets: bool) -> list[int]:
    registry = AdmissionRegistry()
    controller = registry.register(profile(lanes, budgets=budgets))
    estimate = (
        Estimate(tokens=10, cost_usd=0.001, retained_work=1) if budgets else Estimate(tokens=10)
    )
    holders = []
    for i in range(lanes):
        holders.append(
            await controller.acquire(AdmissionRequest(f"h{i}", f"p{i}", WORKSPACE, "llm", estimate))
        )
    waiters = [
        asyncio.ensure_future(
            controller.acquire(AdmissionRequest(f"w{i}", f"p{i}", WORKSPACE, "llm", estimate))
        )
        for i in range(lanes)
    ]
    await asyncio.sleep(0)
    queued = sum(controller.snapshot(f"p{i}").queued for i in range(lanes))
    assert queued == lanes, queued
    samples = await round_trips(controller, iterations, budgets=budgets)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    for lease in holders:
        lease.release()
    return samples


def memory_per_principal(count: int) -> tuple[float, float, float]:
    """Bytes per registered principal: the profile, then after each principal was used once."""
    doc_limits = {"concurrency": 2, "requestsPerMinute": 600, "tokensPerSecond": 8000}
    doc = {
        "profileVersion": "memory",
        "workspace": {"concurrency": 1_000_000},
        "providers": {"llm": {"concurrency": 1_000_000}},
        "principals": [{"id": f"tenant-{i:06d}", "limits": dict(doc_limits)} for i in range(count)],
    }
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    registry = AdmissionRegistry()
    controller = registry.register(Profile.from_dict(doc, workspace_id=WORKSPACE))
    registered = tracemalloc.get_traced_memory()[0] - base

    async def touch_all() -> None:
        for i in range(count):
            request = AdmissionRequest("once", f"tenant-{i:06d}", WORKSPACE, "llm", Estimate())
            (await controller.acquire(request)).release(success=True)
        controller.release_budget("once")

    asyncio.run(touch_all())
    gc.collect()
    used, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return registered / count, (used - base) / count, (peak - base) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    print(f"Python {sys.version.split()[0]}, one core, {args.iterations:,} round trips per case")
    for budgets in (False, True):
        kind = "with budgets + release_budget" if budgets else "concurrency + buckets + breaker"

        async def uncontended(budgets: bool = budgets) -> list[int]:
            registry = AdmissionRegistry()
            controller = registry.register(profile(0, budgets=budgets))
            await round_trips(controller, 10_000, budgets=budgets)  # warm up
            return await round_trips(controller, args.iterations, budgets=budgets)

        base = report(f"uncontended ({kind})", asyncio.run(uncontended()))
        busy = report(
            f"{args.lanes:,} principals, {args.lanes:,} queued elsewhere",
            asyncio.run(contended(args.iterations, args.lanes, budgets=budgets)),
        )
        print(f"{'':<46} contended / uncontended p50: {busy / base:.2f}x")
    registered, used, peak = memory_per_principal(args.lanes)
    print(
        f"memory per registered principal: {registered:,.0f} B in the profile, "
        f"{used:,.0f} B after each was used once (peak {peak:,.0f} B)"
    )


if __name__ == "__main__":
    main()
