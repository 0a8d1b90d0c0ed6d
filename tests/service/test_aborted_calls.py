"""An aborted call keeps its permit until the provider is done with it (real processes).

The provider is a loopback OpenAI-compatible server that works on every call for a fixed service
time whether or not the caller is still there, and counts the calls it is working on. Its profile
allows one call at a time. Run A's call is at the server when it is aborted (a cancel, the run
taken back by another worker's sweeper while its own worker is frozen, the worker's admission
lease lost while Redis is stopped); run B waits for the permit. B's call must not reach the
server before A's own timeout would have ended A's call: the server never works on two calls at
once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedis
from tests.service.conftest import Deployment, admission_redis_env, wait_for

pytestmark = pytest.mark.celery

RUNS = "/api/workspaces/demo/evaluations/"

ACTIVATE_ONE_AT_A_TIME = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-one-call")
document["providers"]["fake"].update(concurrency=1, maxQueueWaitMs=60000)
print(demo_version_activate(document).kind)
"""


def _one_decision(timeout_ms: int, text: str) -> dict[str, Any]:
    document = example_request(1)
    document["input"]["text"] = text
    document["ruleset"]["decisions"][0]["binding"]["primary"]["timeoutMs"] = timeout_ms
    return document


def _start(
    deployment: Deployment, server: LoopbackServer, extra: dict[str, str] | None = None
) -> dict[str, str]:
    adapter = {"kind": "openai-chat", "baseUrl": server.base_url}
    env = {
        "SLUICE_ADAPTERS": json.dumps({"fake": adapter}),
        "SLUICE_CANCEL_CHECK_SECONDS": "0.2",
        # Heartbeats are written by the dispatcher's poll: the worker notices a lost run soon.
        "SLUICE_RUN_HEARTBEAT_SECONDS": "0.5",
        "SLUICE_DISPATCH_POLL_SECONDS": "0.5",
        **admission_redis_env(deployment),
        **(extra or {}),
    }
    deployment.django(ACTIVATE_ONE_AT_A_TIME)
    deployment.start_web(env)
    deployment.start_worker({**env, "SLUICE_WORKER_SLOTS": "2"})
    return env


def _a_then_b(
    deployment: Deployment, server: LoopbackServer, timeout_ms: int
) -> tuple[str, str, float]:
    """Run A's call reaches the server; run B queues behind it. Returns both ids and the time A's
    call arrived."""
    first = deployment.submit(_one_decision(timeout_ms, "run A"))["id"]
    assert server.received.acquire(timeout=60), "run A's call never reached the provider"
    arrived = server.requests[0]["at"]
    second = deployment.submit(_one_decision(60_000, "run B"))["id"]
    # B is waiting for admission once its receipt exists with no call in flight.
    wait_for(lambda: deployment.evaluation(second)["status"] == "running", 30, "run B to start")
    time.sleep(0.5)
    assert len(server.requests) == 1, "run B was admitted beside run A"
    return first, second, arrived


def _b_waited_for_a_timeout(
    deployment: Deployment, server: LoopbackServer, second: str, arrived: float, timeout_ms: int
) -> dict[str, Any]:
    run = deployment.wait_run(second, timeout=60)
    assert run["status"] == "completed", run
    assert len(server.requests) == 2, "a call reached the provider twice"
    gap = server.requests[1]["at"] - arrived
    # A's timeout counts from its admission request, a little before its call arrived (the
    # receipt is written and the connection opened in between): B's permit came free then.
    assert timeout_ms / 1000 - 1.0 <= gap <= timeout_ms / 1000 + 1.5, gap
    assert server.max_in_flight == 1
    return run


def _held(attempt: dict[str, Any], reason: str, timeout_ms: int) -> None:
    assert attempt["sent"] is True
    assert attempt["outcome"] == "execution-uncertain"
    held = attempt["permitHeld"]
    assert held["reason"] == reason
    assert abs(held["untilMs"] - (attempt["startedMs"] + timeout_ms)) < 50, held


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_a_cancelled_call_keeps_its_permit_until_its_timeout(deployment):
    timeout_ms, service = 3000, 2.5
    with LoopbackServer() as server:
        server.replies.append(Reply(content="yes", delay=service))
        server.default = Reply(content="yes", delay=0.3)
        _start(deployment, server)
        first, second, arrived = _a_then_b(deployment, server, timeout_ms)

        response = deployment.api("POST", f"{RUNS}{first}/cancel/")
        assert response.status_code == 202, response.text
        cancelled = deployment.wait_run(first, timeout=30)
        # The run ends at once; only its permit waits.
        assert time.monotonic() - arrived < service
        assert cancelled["status"] == "cancelled", cancelled
        _held(cancelled["attempts"][0], "cancelled", timeout_ms)

        _b_waited_for_a_timeout(deployment, server, second, arrived, timeout_ms)


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_a_call_of_a_run_swept_from_a_frozen_worker_keeps_its_permit_until_its_timeout(
    deployment,
):
    # Worker A is frozen (SIGSTOP) with run A's call at the provider, longer than the stale
    # window; worker B's own sweeper takes run A back and B resumes it. Thawed, A finds run A is
    # no longer its own and aborts the call, whose permit it holds until A's timeout: run B,
    # waiting on B for that permit, reaches the provider only then.
    timeout_ms, service, stale = 10_000, 9.0, 3.0
    with LoopbackServer() as server:
        server.replies.append(Reply(content="yes", delay=service))
        server.default = Reply(content="yes", delay=0.3)
        env = _start(deployment, server, {"SLUICE_RUN_STALE_SECONDS": str(stale)})
        deployment.start_worker({**env, "SLUICE_WORKER_SLOTS": "2"})
        first = deployment.submit(_one_decision(timeout_ms, "run A"))["id"]
        assert server.received.acquire(timeout=60), "run A's call never reached the provider"
        arrived = server.requests[0]["at"]
        holder = _sql(
            deployment,
            "SELECT w.pid FROM evaluator_evaluationrun r JOIN evaluator_workerprocess w "
            "ON w.id = r.claimed_by WHERE r.id = %s",
            [first],
        )[0][0]
        frozen = next(p for p in deployment.processes if p.pid == holder)
        sweeper = next(p for p in deployment.processes[1:] if p is not frozen)

        os.killpg(frozen.pid, signal.SIGSTOP)
        try:
            second = deployment.submit(_one_decision(60_000, "run B"))["id"]
            # Only B's sweeper can take run A back: A's process is alive, its heartbeat old.
            try:
                wait_for(
                    lambda: f"evaluation {first}: its worker" in sweeper.log(),
                    stale + 15,
                    "worker B's sweeper to take run A back",
                )
            except AssertionError as missed:
                # What worker B was doing instead (its sweeps, beats and runs), for the reader.
                raise AssertionError(f"{missed}\n{sweeper.log()[-6000:]}") from None
            assert "back in the backlog" in sweeper.log()
            resumed = deployment.wait_run(first, timeout=30)
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
        # B resumed run A from its receipt: the call that was out is never sent again.
        assert resumed["status"] == "execution-uncertain", resumed
        assert resumed["deliveries"] == 2
        assert [a["reason"] for a in resumed["attempts"]] == ["dispatch-unconfirmed"]
        assert "claimed again (delivery 2)" in sweeper.log()
        assert time.monotonic() - arrived < service, "run A's call ended before the thaw"

        wait_for(lambda: "is no longer this worker's" in frozen.log(), 30, "worker A to notice")
        _b_waited_for_a_timeout(deployment, server, second, arrived, timeout_ms)
        assert "call-abandoned" in frozen.log()
        assert "its permit is held" in frozen.log()
        assert len(server.requests) == 2


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_a_call_whose_admission_lease_is_lost_keeps_its_permit_until_its_timeout(deployment):
    # The worker stops trusting its lease after 80 % of the TTL without renewal (3.2 s, noticed
    # within 0.2 s); Redis comes back before the TTL is over, so the lease itself lives on.
    ttl_ms, stall, timeout_ms, service = 4000, 3.6, 8000, 6.0
    redis = PrivateRedis()
    try:
        with LoopbackServer() as server:
            server.replies.append(Reply(content="yes", delay=service))
            server.default = Reply(content="yes", delay=0.3)
            _start(
                deployment,
                server,
                {
                    "SLUICE_ADMISSION_REDIS_URL": redis.url,
                    "SLUICE_ADMISSION_LEASE_TTL_MS": str(ttl_ms),
                    "SLUICE_ADMISSION_HEARTBEAT_MS": "100",
                    "SLUICE_ADMISSION_TIMEOUT_MS": "100",
                },
            )
            first, second, arrived = _a_then_b(deployment, server, timeout_ms)

            assert redis.process is not None
            redis.process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(stall)
            finally:
                redis.process.send_signal(signal.SIGCONT)

            run = deployment.wait_run(first, timeout=30)
            # A's call was aborted while the provider still worked on it (it takes 5 s).
            assert time.monotonic() - arrived < service + 1.0
            _held(run["attempts"][0], "admission-lease-lost", timeout_ms)
            _b_waited_for_a_timeout(deployment, server, second, arrived, timeout_ms)
    finally:
        redis.destroy()


def _sql(deployment: Deployment, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
    import psycopg

    assert deployment.database is not None
    with psycopg.connect(deployment.database.url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_a_call_cut_by_a_worker_shutdown_keeps_its_permit_until_its_timeout(deployment):
    # Redis keeps a stopped process's permits for a lease TTL after its last renewal: the
    # stopping worker lives on only for what outlasts that.
    timeout_ms, service, ttl_ms = 6000, 5.5, 1500
    with LoopbackServer() as server:
        server.replies.append(Reply(content="yes", delay=service))
        server.default = Reply(content="yes", delay=0.3)
        extra = {
            "SLUICE_ADMISSION_LEASE_TTL_MS": str(ttl_ms),
            "SLUICE_ADMISSION_HEARTBEAT_MS": "300",
            "SLUICE_WORKER_DRAIN_SECONDS": "0.5",
        }
        env = _start(deployment, server, extra)
        deployment.start_worker({**env, "SLUICE_WORKER_SLOTS": "2"})
        first, second, arrived = _a_then_b(deployment, server, timeout_ms)

        holder = _sql(
            deployment,
            "SELECT w.pid FROM evaluator_evaluationrun r JOIN evaluator_workerprocess w "
            "ON w.id = r.claimed_by WHERE r.id = %s",
            [first],
        )[0][0]
        stopping = next(p for p in deployment.processes if p.pid == holder)
        stopping.stop()
        assert "aborted (call-abandoned)" in stopping.log()
        assert "permits stay held until their timeouts" in stopping.log()

        run = deployment.wait_run(second, timeout=60)
        assert run["status"] == "completed", run
        gap = server.requests[1]["at"] - arrived
        # Not before A's timeout; at most a lease TTL after it (Redis reaps the stopped worker).
        assert timeout_ms / 1000 - 1.0 <= gap <= (timeout_ms + ttl_ms) / 1000 + 1.5, gap
        assert server.max_in_flight == 1
        resumed = deployment.wait_run(first, timeout=60)
        assert resumed["status"] == "execution-uncertain", resumed
        assert [a["reason"] for a in resumed["attempts"]] == ["dispatch-unconfirmed"]
