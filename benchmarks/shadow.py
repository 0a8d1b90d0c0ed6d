"""Shadow benchmark: what a running shadow profile adds to each attempt of an evaluation.

The same 2 000-decision ruleset runs through the evaluator with a fake adapter (no latency) at
concurrency 1 and 8, without a shadow and with one (a shadow as wide as the active profile, so
both decide the same; and a tight one that queues and refuses). Prints microseconds per attempt
(the median of several rounds) and the shadow's share; asserts nothing.

Run with `python benchmarks/shadow.py` (or `make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from admission.core import AdmissionRegistry, Profile
from evaluator.engine.adapters import FakeAdapter
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.scheduler import evaluate_decision_ruleset

WORKSPACE = "bench-workspace"
PRINCIPAL = "bench-principal"
WIDE = {"concurrency": 10_000, "requestsPerMinute": 1e12, "tokensPerSecond": 1e12}
TIGHT = {"concurrency": 2, "maxQueueLength": 4, "requestsPerMinute": 1e12}


def profile(label: str, workspace: dict) -> Profile:
    return Profile.from_dict(
        {
            "profileVersion": label,
            "workspace": workspace,
            "providers": {"fake": WIDE},
            "principals": {PRINCIPAL: WIDE},
        },
        workspace_id=WORKSPACE,
    )


def request(count: int, concurrency: int) -> DecisionEvaluationRequest:
    decisions = [
        {
            "id": f"d{i}",
            "prompt": "Is ${text} acceptable?",
            "allowedOutputs": ["yes", "no"],
            "binding": {"primary": {"adapter": "fake", "model": "bench-model"}},
        }
        for i in range(count)
    ]
    return DecisionEvaluationRequest.from_dict(
        {
            "ruleset": {"id": "bench", "decisions": decisions},
            "input": {"text": "the benchmark input"},
            "scheduler": {"enabled": concurrency > 1, "bindingConcurrency": concurrency},
        },
        principal_id=PRINCIPAL,
        workspace_id=WORKSPACE,
    )


async def one_round(count: int, concurrency: int, shadow: str) -> float:
    registry = AdmissionRegistry()
    registry.register(profile("active", WIDE))
    if shadow != "none":
        registry.start_shadow(profile("shadow", WIDE if shadow == "wide" else TIGHT))
    req = request(count, concurrency)
    fake = FakeAdapter()
    gc.collect()
    started = time.perf_counter()
    result = await evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake})
    elapsed = time.perf_counter() - started
    assert result.succeeded and len(fake.calls) == count
    running = registry.shadow(WORKSPACE)
    if running is not None:
        await asyncio.sleep(0.01)
        active, _would_be = running.drain()
        assert active["requests"] == count
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.decisions} decisions per run, median of {args.rounds} rounds, fake adapter")
    print(f"{'concurrency':>11}  {'shadow':>6}  {'us/attempt':>10}  {'added':>8}")
    for concurrency in (1, 8):
        baseline = None
        for shadow in ("none", "wide", "tight"):
            times = [
                asyncio.run(one_round(args.decisions, concurrency, shadow))
                for _ in range(args.rounds)
            ]
            per_attempt = statistics.median(times) / args.decisions * 1e6
            if baseline is None:
                baseline = per_attempt
                added = "—"
            else:
                added = f"+{per_attempt - baseline:.1f} us"
            print(f"{concurrency:>11}  {shadow:>6}  {per_attempt:>10.1f}  {added:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
