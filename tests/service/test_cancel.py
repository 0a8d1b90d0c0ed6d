"""Cancelling runs and watching them progress, with real processes: a web server, a Celery worker
on a real broker, and a loopback OpenAI-compatible provider that holds its answers until the test
lets them go. The cancel reaches the worker through the database
(evaluator/worker/cancel_watch.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.service.conftest import Deployment, demo_provider_over_http

pytestmark = pytest.mark.celery

RUNS = "/api/workspaces/demo/evaluations/"
# Held calls wait for the test's release; only a test that failed waits this long.
HOLD_SECONDS = 300.0


def _provider_env(server: LoopbackServer) -> dict[str, str]:
    # The demo profile's provider is `fake`: here it is an OpenAI-compatible HTTP endpoint.
    return {"SLUICE_ADAPTERS": demo_provider_over_http(server.base_url)}


def _request(decisions: int) -> dict[str, Any]:
    document = example_request(decisions)
    for decision in document["ruleset"]["decisions"]:
        # Long enough that only the cancel, never the target's timer, ends a held call.
        decision["binding"]["primary"]["timeoutMs"] = 120_000
    return document


def _received(server: LoopbackServer, count: int, timeout: float = 60) -> None:
    for _ in range(count):
        assert server.received.acquire(timeout=timeout), "the provider was not called in time"


def _cancel(deployment: Deployment, run_id: str, user: str = "demo-proposer") -> Any:
    return deployment.api("POST", f"{RUNS}{run_id}/cancel/", user=user)


def test_a_running_run_shows_its_progress_and_a_cancel_aborts_its_call(deployment):
    release = threading.Event()
    with LoopbackServer() as server:
        # The first decision is answered at once; every later call is held.
        server.replies.append(Reply(content="yes"))
        server.default = Reply(content="yes", hold=release, hold_seconds=HOLD_SECONDS)
        try:
            env = _provider_env(server)
            deployment.start_web(env)
            deployment.start_worker(env)
            submitted = deployment.submit(_request(3))
            _received(server, 2)

            # The receipt records decision 1 and marks decision 2 dispatched before the call.
            running = deployment.evaluation(submitted["id"])
            assert running["status"] == "running"
            assert running["result"] is None
            progress = running["progress"]
            assert progress["decisionsTotal"] == 3
            assert progress["decisionsDone"] == 1
            assert progress["outcomes"] == {"succeeded": 1}
            assert progress["attempts"] == 1
            [flight] = progress["inFlight"]
            assert flight["decisionId"] == "check-2"
            assert flight["evidence"]["decision"] == "admit"
            [first] = running["attempts"]
            assert first["decisionId"] == "check-1"
            assert first["outcome"] == "succeeded"
            assert first["evidence"]["reason"] == "admitted"

            asked = time.monotonic()
            response = _cancel(deployment, submitted["id"])
            assert response.status_code == 202, response.text
            assert response.json()["status"] == "running"
            assert response.json()["cancelRequestedBy"] == "demo-proposer"
            run = deployment.wait_run(submitted["id"], timeout=30)
            took = time.monotonic() - asked
        finally:
            release.set()
        assert run["status"] == "cancelled", run
        assert [(d["decisionId"], d["status"]) for d in run["result"]["decisions"]] == [
            ("check-1", "succeeded"),
            # Sent and cut short: nobody knows what the provider did with it.
            ("check-2", "execution-uncertain"),
            ("check-3", "cancelled"),
        ]
        assert [(a["decisionId"], a["sent"], a["reason"]) for a in run["attempts"]] == [
            ("check-1", True, "answered"),
            ("check-2", True, "cancelled"),
        ]
        assert run["progress"]["decisionsDone"] == 3
        assert run["progress"]["inFlight"] == []
        # Nothing was dispatched after the cancel.
        assert len(server.requests) == 2
        print(
            f"\ncancel of a running run ({deployment.mode}): ended {took:.2f} s after the request"
        )
        assert deployment.api("POST", f"{RUNS}{submitted['id']}/cancel/").status_code == 409


def test_a_run_cancelled_while_queued_never_starts(deployment):
    with LoopbackServer() as server:
        env = _provider_env(server)
        deployment.start_web(env)
        queued = deployment.submit(_request(2))
        response = _cancel(deployment, queued["id"])
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"

        # A worker comes up afterwards and takes the queue: the cancelled run's message too.
        deployment.start_worker(env)
        later = deployment.submit(_request(1))
        assert deployment.wait_run(later["id"])["status"] == "completed"

        cancelled = deployment.evaluation(queued["id"])
        assert cancelled["status"] == "cancelled"
        assert cancelled["deliveries"] == 0
        assert cancelled["startedAt"] is None
        assert [d["status"] for d in cancelled["result"]["decisions"]] == ["cancelled"] * 2
        assert cancelled["attempts"] == []
        # Only the later run's one decision reached the provider.
        assert len(server.requests) == 1


ONE_AT_A_TIME = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-one-at-a-time")
document["providers"]["fake"]["concurrency"] = 1
demo_version_activate(document)
"""


def test_a_run_waiting_for_admission_leaves_the_queue_when_cancelled(deployment):
    release = threading.Event()
    with LoopbackServer() as server:
        server.default = Reply(content="yes", hold=release, hold_seconds=HOLD_SECONDS)
        try:
            env = _provider_env(server)
            deployment.django(ONE_AT_A_TIME)
            deployment.start_web(env)
            # One process, one event loop, two evaluations on it at once.
            deployment.start_worker(env, concurrency=2, pool="threads")
            holder = deployment.submit(_request(1))
            _received(server, 1)
            waiter = deployment.submit(_request(1))

            # Its receipt exists once its worker started the engine, which then asks admission.
            has_receipt = (
                "from evaluator.models import Receipt;"
                f"print(Receipt.objects.filter(invocation_id='{waiter['invocationId']}').exists())"
            )
            deployment._wait(
                lambda: deployment.django(has_receipt).strip().endswith("True"),
                60,
                "the second run was not started",
            )
            response = _cancel(deployment, waiter["id"])
            assert response.status_code == 202, response.text
            run = deployment.wait_run(waiter["id"], timeout=30)
            # It ended while the first run still held the provider's only permit.
            assert deployment.evaluation(holder["id"])["status"] == "running"
            assert server.in_flight == 1
        finally:
            release.set()
        assert run["status"] == "cancelled", run
        assert [d["status"] for d in run["result"]["decisions"]] == ["cancelled"]
        # Refused by admission while it queued: never sent, with the evidence of its wait.
        [attempt] = run["attempts"]
        assert (attempt["sent"], attempt["outcome"], attempt["reason"]) == (
            False,
            "cancelled",
            "cancelled",
        )
        assert attempt["evidence"]["decision"] == "reject"
        assert attempt["evidence"]["reason"] == "cancelled"
        assert attempt["evidence"]["queueDelayMs"] > 0
        assert deployment.wait_run(holder["id"])["status"] == "completed"
        assert len(server.requests) == 1
