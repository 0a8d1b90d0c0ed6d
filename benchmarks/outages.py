"""Decisions answered and refused when the admission Redis fails mid-run.

    python benchmarks/outages.py [--runs 12] [--decisions 10] [--scenario NAME ...]

Runs `--runs` evaluations of `--decisions` decisions each through the evaluation engine, with
admission decided in a private `redis-server` this script starts (a free port, no persistence),
a provider limited to 2 calls at once and a fake adapter that answers in 300 ms. Each scenario
starts the evaluations, waits for the first calls, then:

- `none`: nothing happens (the baseline);
- `stopped-10s`: Redis is SIGSTOPped for 10 s, then SIGCONTed;
- `restarted-empty`: Redis is killed and started again empty after 3 s;
- `stopped-10s-short-deadline`: as `stopped-10s`, with every decision's timeout 3 s.

Prints, per scenario: decisions by status, admission refusals by reason (those an attempt waited
through included), the most calls in flight at the adapter, and the time from Redis's return to
the first call after it. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import AdmissionRegistry, Profile
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.scheduler import evaluate_decision_ruleset

WORKSPACE = "outage"
PRINCIPAL = "caller"
CONCURRENCY = 2
SCENARIOS = ("none", "stopped-10s", "restarted-empty", "stopped-10s-short-deadline")


class Server:
    """A throwaway redis-server on a free port."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.dir = tempfile.mkdtemp(prefix="sluice-outage-")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", self.dir]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def destroy(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _profile() -> Profile:
    return Profile.from_dict(
        {
            "profileVersion": "outage-v1",
            "workspace": {"concurrency": 100},
            "providers": {"fake": {"concurrency": CONCURRENCY, "maxQueueWaitMs": 600_000}},
            "principals": {PRINCIPAL: {"concurrency": 100}},
        },
        workspace_id=WORKSPACE,
    )


def _request(index: int, decisions: int, timeout_ms: int) -> DecisionEvaluationRequest:
    target = {"adapter": "fake", "model": "m", "timeoutMs": timeout_ms}
    ruleset = {
        "id": "outage",
        "decisions": [
            {
                "id": f"d{n}",
                "prompt": "Is ${text} acceptable?",
                "allowedOutputs": ["yes", "no"],
                "binding": {"primary": target},
            }
            for n in range(decisions)
        ],
    }
    return DecisionEvaluationRequest.from_dict(
        {"ruleset": ruleset, "input": {"text": f"case {index}"}},
        principal_id=PRINCIPAL,
        workspace_id=WORKSPACE,
    )


async def scenario(name: str, runs: int, decisions: int) -> dict[str, Any]:
    server = Server()
    settings = CoordinationSettings(
        url=server.url, prefix=f"bench-{uuid.uuid4().hex[:8]}", recovery_grace_ms=3000
    )
    coordinator = RedisCoordinator(settings)
    registry = AdmissionRegistry(controller_factory=coordinator.controller)
    registry.register(_profile(), sequence=1)
    adapter = FakeAdapter(default=FakeStep(latency_ms=300))
    timeout_ms = 3_000 if name.endswith("short-deadline") else 120_000
    back_ms: float | None = None
    try:
        tasks = [
            asyncio.ensure_future(
                evaluate_decision_ruleset(
                    _request(i, decisions, timeout_ms),
                    registry=registry,
                    adapters={"fake": adapter},
                )
            )
            for i in range(runs)
        ]
        while len(adapter.calls) < 4:
            await asyncio.sleep(0.05)
        if name.startswith("stopped-10s"):
            server.signal(signal.SIGSTOP)
            await asyncio.sleep(10)
            server.signal(signal.SIGCONT)
            back_ms = registry.clock.monotonic_ms()
        elif name == "restarted-empty":
            server.kill()
            await asyncio.sleep(3)
            server.start()
            back_ms = registry.clock.monotonic_ms()
        results = await asyncio.gather(*tasks)
    finally:
        await coordinator.aclose()
        server.destroy()
    statuses: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    unanswered = 0
    for result in results:
        for decision in result.decisions:
            statuses[decision.status] += 1
            last = decision.attempts[-1] if decision.attempts else None
            if last is not None and not last.sent and last.infrastructure_refusals:
                unanswered += 1
            for attempt in decision.attempts:
                for reason, count in (attempt.infrastructure_refusals or {}).items():
                    refusals[reason] += count
                if not attempt.sent and attempt.reason not in (
                    attempt.infrastructure_refusals or {}
                ):
                    refusals[attempt.reason] += 1
    first_after = None
    if back_ms is not None:
        later = [call.started_ms for call in adapter.calls if call.started_ms >= back_ms]
        first_after = round(min(later) - back_ms) if later else None
    return {
        "scenario": name,
        "decisions": dict(statuses),
        "refusalsByReason": dict(refusals),
        # Decisions whose deadline passed while they waited for the outage to end.
        "unansweredByOutage": unanswered,
        "maxCallsInFlight": adapter.max_active,
        "firstCallAfterRedisReturnsMs": first_after,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--decisions", type=int, default=10)
    parser.add_argument("--scenario", choices=SCENARIOS, action="append")
    args = parser.parse_args()
    for name in args.scenario or SCENARIOS:
        print(json.dumps(await scenario(name, args.runs, args.decisions)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
