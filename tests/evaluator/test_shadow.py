"""Shadow profiles: the same load decided under the active and, in dry run, the shadow's limits."""

from __future__ import annotations

import asyncio
from typing import Any

from admission.core import merge_tallies
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import (
    profile,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)

RUNS = 3
DECISIONS = 6
LATENCY_MS = 10

# The shadow lets two requests run and four wait; the active profile admits everything at once.
TIGHT = {"concurrency": 2, "maxQueueLength": 4}


def _load(loop: Any, *, shadow: bool) -> Any:
    async def main() -> Any:
        registry = registry_with(loop, profile())
        started = None
        if shadow:
            started = registry.start_shadow(
                profile(version="v2-tight", workspace=TIGHT), session="s-1"
            )
        fake = FakeAdapter(default=FakeStep(latency_ms=LATENCY_MS))
        requests = [
            request(
                ruleset_doc(DECISIONS),
                scheduler={"enabled": True, "bindingConcurrency": DECISIONS},
                invocationId=f"run-{index}",
            )
            for index in range(RUNS)
        ]
        results = await asyncio.gather(
            *(
                evaluate_decision_ruleset(item, registry=registry, adapters={"fake": fake})
                for item in requests
            )
        )
        # Let the shadow's last permits go back on their own schedule.
        await asyncio.sleep(1.0)
        return results, fake, started

    return main()


def _attempts(results: list[Any]) -> list[Any]:
    return [
        [
            (a.outcome, a.reason, a.started_ms, a.ended_ms, a.evidence)
            for d in result.decisions
            for a in d.attempts
        ]
        for result in results
    ]


def test_a_tighter_shadow_records_deferrals_and_rejections_and_changes_nothing_real():
    baseline, baseline_fake, _ = run_virtual(lambda loop: _load(loop, shadow=False))
    results, fake, shadow = run_virtual(lambda loop: _load(loop, shadow=True))

    # Reality is exactly what it is without a shadow: same outcomes, timings and evidence.
    assert _attempts(results) == _attempts(baseline)
    assert [c.started_ms for c in fake.calls] == [c.started_ms for c in baseline_fake.calls]
    assert all(d.status == "succeeded" for r in results for d in r.decisions)

    active, would_be = shadow.drain()
    total = RUNS * DECISIONS
    assert active["requests"] == would_be["requests"] == total
    # Nothing waited or was refused in reality...
    assert active["admitted"] == total
    assert active["deferred"] == 0 and active["rejected"] == {}
    # ...while the shadow ran two, queued four behind them and refused the rest.
    assert would_be["admitted"] == 2 + 4
    assert would_be["deferred"] == 4
    assert would_be["rejected"] == {"queue-full": total - 6}
    assert would_be["maxQueued"] == 4
    assert would_be["queueDelayMs"]["max"] > 0
    # queue-full is retryable: each refusal of a request reality admitted costs a retry.
    assert would_be["wouldRetry"] == total - 6
    # Every shadow permit went back and the shadow kept no invocation budget.
    assert not shadow.calls
    assert shadow.controller.is_idle(shadow.clock.monotonic_ms() + 60_000)


def test_a_looser_shadow_admits_at_once_what_reality_queues():
    async def main(loop: Any) -> Any:
        registry = registry_with(loop, profile(workspace={"concurrency": 1}))
        shadow = registry.start_shadow(profile(version="v2-loose"))
        fake = FakeAdapter(default=FakeStep(latency_ms=LATENCY_MS))
        runs = [request(ruleset_doc(2), invocationId=f"run-{index}") for index in range(3)]
        await asyncio.gather(
            *(
                evaluate_decision_ruleset(r, registry=registry, adapters={"fake": fake})
                for r in runs
            )
        )
        await asyncio.sleep(1.0)
        return shadow.drain()

    active, would_be = run_virtual(main)
    # Three serial runs share one workspace permit in reality; the shadow has 64.
    assert active["admitted"] == would_be["admitted"] == 6
    assert active["deferred"] == 5 and active["maxQueued"] >= 1
    assert would_be["deferred"] == 0 and would_be["maxQueued"] == 0
    assert active["rejected"] == would_be["rejected"] == {}


def test_a_stopped_shadow_mirrors_nothing_and_tallies_merge():
    async def main(loop: Any) -> Any:
        registry = registry_with(loop, profile())
        shadow = registry.start_shadow(profile(version="v2", workspace=TIGHT))
        assert registry.shadow(profile().workspace_id) is shadow
        assert registry.stop_shadow(profile().workspace_id) is shadow
        assert registry.shadow(profile().workspace_id) is None
        fake = FakeAdapter(default=FakeStep(latency_ms=LATENCY_MS))
        await evaluate_decision_ruleset(
            request(ruleset_doc(2)), registry=registry, adapters={"fake": fake}
        )
        return shadow.drain()

    active, would_be = run_virtual(main)
    assert active["requests"] == would_be["requests"] == 0
    merged = merge_tallies(
        [
            {"requests": 2, "rejected": {"queue-full": 1}, "maxQueued": 3},
            {"requests": 1, "rejected": {"queue-full": 2, "tokens": 1}, "maxQueued": 1},
        ]
    )
    assert merged["requests"] == 3
    assert merged["rejected"] == {"queue-full": 3, "tokens": 1}
    assert merged["maxQueued"] == 3
