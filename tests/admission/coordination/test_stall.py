"""A Redis that stalls (SIGSTOP) longer than the lease TTL never deadlocks admission.

Two real driver processes keep waiters queued in front of a loopback provider with a ceiling of
two; Redis is frozen mid-load for 1.5x and 10x the lease TTL, then thawed. Admission must resume
by itself within the documented bound (one lease TTL after Redis answers again, see
docs/admission-coordination.md, "Liveness"), every run must end, the provider must never see more
calls at once than the ceiling, and no call may be sent twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.admission.coordination.test_processes import Drivers, document, wait_for
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedis

LEASE_TTL_MS = 1000
SETTINGS = {
    "lease_ttl_ms": LEASE_TTL_MS,
    "heartbeat_ms": 100,
    "recovery_grace_ms": 300,
    "timeout_ms": 200,
}
CEILING = 2
PROFILE = document({"concurrency": CEILING}, "stall-v1")
CALLS_PER_RUN = 40
# Scheduling slack of a loaded 2-core machine on top of the documented bound.
SLACK_S = 1.0


@pytest.mark.parametrize("stall_ttls", [1.5, 10.0], ids=["1.5x-ttl", "10x-ttl"])
def test_admission_resumes_after_a_redis_stall_of_any_length(
    tmp_path: Path, stall_ttls: float, private_redis: PrivateRedis
) -> None:
    stall_s = stall_ttls * LEASE_TTL_MS / 1000
    with LoopbackServer() as provider:
        provider.default = Reply(delay=0.05)
        drivers = Drivers(tmp_path, private_redis.url, provider.base_url, PROFILE)
        try:
            for principal in ("alice", "bob"):
                drivers.start(
                    settings=SETTINGS,
                    principal=principal,
                    concurrency=4,
                    count=100_000,
                    complete=CALLS_PER_RUN,
                    seconds=stall_s + 60,
                    # Waiters give up during the stall and their callers queue again.
                    deadline_ms=600,
                )
            # Mid-load: calls went out and both processes have waiters queued in Redis.
            wait_for(lambda: len(provider.requests) >= 6, 30, "calls did not start")
            wait_for(lambda: _queued(private_redis) >= 2, 30, "no waiters queued")
            private_redis.pause()
            paused_at = time.monotonic()
            time.sleep(stall_s)
            sent_before = len(provider.requests)
            private_redis.resume()
            resumed_at = time.monotonic()
            wait_for(
                lambda: len(provider.requests) > sent_before,
                LEASE_TTL_MS / 1000 + SLACK_S + 5,
                "no call after the stall",
            )
            drivers.wait(timeout=60)
            ended_at = time.monotonic()
        finally:
            drivers.stop()
            if private_redis.process is not None:
                private_redis.resume()
        first_call = min(r["at"] for r in provider.requests if r["at"] > resumed_at)
        figures = {
            "stall_s": stall_s,
            "first_call_after_resume_s": round(first_call - resumed_at, 3),
            "last_run_end_after_resume_s": round(ended_at - resumed_at, 3),
            "calls": len(provider.requests),
            "max_in_flight": provider.max_in_flight,
        }
        print(json.dumps(figures))
        assert paused_at < resumed_at
        # Calls resume within one lease TTL of Redis answering again.
        assert first_call - resumed_at <= LEASE_TTL_MS / 1000 + SLACK_S, figures
        # Never more calls at the provider than its ceiling, before, during or after.
        assert provider.max_in_flight <= CEILING, figures
        # No call sent twice.
        ids = Counter(r["body"]["id"] for r in provider.requests)
        assert max(ids.values()) == 1
        # Every run ended with all its calls completed.
        for index in range(2):
            done = [line for line in drivers.lines(index) if line["decision"] == "done"]
            assert len(done) >= CALLS_PER_RUN


def _queued(server: PrivateRedis) -> int:
    import redis

    client = redis.Redis.from_url(server.url)
    total = 0
    for key in client.scan_iter("*:W", count=1000):
        total += int(client.hlen(key))
    return total
