"""Runs that are never lost: each fault with real processes and the project's default bounds.

The provider is a loopback OpenAI-compatible server that records every request; each decision's
prompt names its run, so "no decision dispatched twice" is counted where calls arrive. Each test
ends with every run terminal within the documented bound (60 s) after the fault.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivatePostgres, PrivateRedis

from .conftest import (
    TERMINAL,
    Deployment,
    admission_redis_env,
    demo_provider_over_http,
    full_mode_urls,
    wait_for,
)

pytestmark = pytest.mark.celery

BOUND_SECONDS = 60
STALE_SECONDS = 10


@pytest.fixture
def provider():
    with LoopbackServer() as server:
        server.default = Reply(delay=0.3)
        yield server


def _use(deployment: Deployment, provider: LoopbackServer) -> None:
    deployment.env["SLUICE_ADAPTERS"] = demo_provider_over_http(provider.base_url)


def _document(tag: str, decisions: int) -> dict[str, Any]:
    document = example_request(decisions)
    document["input"] = {"text": tag}
    return document


def _submit_many(deployment: Deployment, count: int, decisions: int) -> dict[str, str]:
    """Submit `count` evaluations; returns run id → tag (each tag appears in its prompts)."""
    runs = {}
    for index in range(count):
        tag = f"run-{index}-{uuid.uuid4().hex[:6]}"
        runs[deployment.submit(_document(tag, decisions))["id"]] = tag
    return runs


def _statuses(deployment: Deployment) -> dict[str, str]:
    response = deployment.api("GET", "/api/workspaces/demo/evaluations/?page_size=500")
    return {run["id"]: run["status"] for run in response.json()["results"]}


def _wait_all_terminal(deployment: Deployment, runs: dict[str, str], bound: float) -> None:
    def done() -> bool:
        try:
            statuses = _statuses(deployment)
        except (httpx.HTTPError, ValueError):
            return False
        return all(statuses.get(run_id) in TERMINAL for run_id in runs)

    wait_for(done, bound, "every run to end")


def _assert_each_decision_sent_at_most_once(
    provider: LoopbackServer, runs: dict[str, str], decisions: int
) -> None:
    prompts = collections.Counter(r["body"]["messages"][1]["content"] for r in provider.requests)
    twice = {prompt: n for prompt, n in prompts.items() if n > 1}
    assert not twice, f"decisions dispatched more than once: {twice}"
    expected = {
        f"Question {i}: is {tag} acceptable?"
        for tag in runs.values()
        for i in range(1, decisions + 1)
    }
    assert set(prompts) <= expected


def _assert_settled(deployment: Deployment, runs: dict[str, str]) -> list[dict[str, Any]]:
    """Every run terminal, and every decision of a run that ended has an outcome."""
    settled = [deployment.evaluation(run_id) for run_id in runs]
    for run in settled:
        assert run["status"] in TERMINAL, run
        assert run["status"] != "failed", run
        assert len(run["result"]["decisions"]) == run["decisionCount"]
    return settled


# --------------------------------------------------------------------------------- faults


def test_runs_queued_when_redis_restarts_all_run(tmp_path: Path, provider: LoopbackServer) -> None:
    full_mode_urls()
    redis = PrivateRedis()
    deployment = Deployment(tmp_path, "full", broker_url=redis.url)
    # The calls stay at the provider until Redis has restarted: the worker holds as many runs
    # as it may (four times its two slots) and the others wait in the backlog, their doorbells
    # in Redis, however slowly a loaded machine submits them (otherwise the first runs may end
    # and the worker claim every run before the restart).
    released = threading.Event()
    provider.default = Reply(hold=released, delay=0.3)
    try:
        _use(deployment, provider)
        deployment.setup()
        deployment.start_web()
        deployment.start_worker({"SLUICE_WORKER_SLOTS": "2"})
        runs = _submit_many(deployment, 12, 2)
        queue = deployment.env["SLUICE_CELERY_QUEUE"]

        redis.stop()
        restarted = time.monotonic()
        redis.start()
        # Nothing of the queue survived the restart, yet runs wait in the database.
        import redis as redis_client

        assert redis_client.Redis.from_url(redis.url).llen(queue) == 0
        assert "queued" in _statuses(deployment).values()
        released.set()

        _wait_all_terminal(deployment, runs, BOUND_SECONDS - (time.monotonic() - restarted))
        _assert_each_decision_sent_at_most_once(provider, runs, 2)
        _assert_settled(deployment, runs)
    finally:
        released.set()
        deployment.stop()
        redis.destroy()


def test_a_web_server_killed_between_commit_and_publish_loses_no_run(
    deployment: Deployment, provider: LoopbackServer
) -> None:
    _use(deployment, provider)
    hold = deployment.root / "hold-publish"
    hold.touch()
    # The web process runs with a hook that holds each doorbell while the file exists.
    web = deployment.start_web(
        {
            "DJANGO_SETTINGS_MODULE": "tests.service.held_publish_settings",
            "SLUICE_TEST_HOLD_PUBLISH": str(hold),
        }
    )
    document = {**_document("held-run", 3), "invocationId": "held-1"}
    answered: list[Any] = []

    def submit() -> None:
        try:
            answered.append(deployment.submit(document))
        except httpx.HTTPError as error:
            answered.append(error)

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    # The run is committed and the web server waits before publishing its doorbell: kill it.
    wait_for(lambda: Path(f"{hold}.held").exists(), 30, "the web server to hold the publish")
    web.kill_group(signal.SIGKILL)
    killed = time.monotonic()
    thread.join(10)
    assert answered and isinstance(answered[0], httpx.HTTPError)
    hold.unlink()

    deployment.start_web()
    deployment.start_worker()
    (run_id,) = _statuses(deployment)
    held = {run_id: "held-run"}
    _wait_all_terminal(deployment, held, BOUND_SECONDS - (time.monotonic() - killed))
    (run,) = _assert_settled(deployment, held)
    assert run["status"] == "completed"
    assert run["deliveries"] == 1
    _assert_each_decision_sent_at_most_once(provider, held, 3)
    assert len(provider.requests) == 3
    # Submitting the same invocationId again returns that run; it is not run a second time.
    again = deployment.api("POST", "/api/workspaces/demo/evaluations/", json=document)
    assert again.status_code == 200
    assert again.json()["id"] == run_id


def test_postgresql_down_longer_than_the_stale_window_strands_no_run(
    tmp_path: Path, provider: LoopbackServer
) -> None:
    full_mode_urls()
    postgres = PrivatePostgres()
    deployment = Deployment(tmp_path, "full", database_url=postgres.url)
    # A stale window of 10 s (heartbeats every 2 s) rather than the default 30 s: the outage
    # only has to outlast it, and the test waits that long.
    deployment.env["SLUICE_RUN_STALE_SECONDS"] = str(STALE_SECONDS)
    deployment.env["SLUICE_RUN_HEARTBEAT_SECONDS"] = "2"
    try:
        _use(deployment, provider)
        deployment.setup()
        deployment.start_web()
        deployment.start_worker({"SLUICE_WORKER_SLOTS": "4"})
        runs = _submit_many(deployment, 10, 3)
        wait_for(lambda: len(provider.requests) >= 3, 30, "the first calls")

        postgres.stop()
        # Meanwhile the API answers a typed JSON 503, not an HTML error page.
        down = deployment.api("GET", "/api/workspaces/demo/evaluations/")
        assert down.status_code == 503, down.text
        assert down.headers["content-type"].startswith("application/json")
        assert down.json()["error"]["type"] == "database-unavailable"
        assert down.headers["Retry-After"]
        # Longer than the stale window, after which a heartbeat counts as lost.
        time.sleep(STALE_SECONDS + 5)
        postgres.start()
        back = time.monotonic()

        _wait_all_terminal(deployment, runs, BOUND_SECONDS - (time.monotonic() - back))
        _assert_each_decision_sent_at_most_once(provider, runs, 3)
        _assert_settled(deployment, runs)
    finally:
        deployment.stop()
        postgres.destroy()


def test_a_worker_main_process_sigkilled_its_runs_run_elsewhere(
    tmp_path: Path, provider: LoopbackServer
) -> None:
    deployment = Deployment(tmp_path, "full")
    released = threading.Event()
    try:
        _use(deployment, provider)
        # Two workers share admission through Redis (with RabbitMQ as the broker, named apart).
        deployment.env.update(admission_redis_env(deployment))
        deployment.setup()
        deployment.start_web()
        doomed = deployment.start_worker({"SLUICE_WORKER_SLOTS": "3"})
        # The doomed worker's first two calls (the principal's two permits) stay at the
        # provider until it is dead; its other runs wait for admission.
        provider.replies.extend([Reply(hold=released), Reply(hold=released)])
        runs = _submit_many(deployment, 6, 3)
        wait_for(lambda: len(provider.requests) >= 2, 30, "the doomed worker's calls")
        survivor = deployment.start_worker({"SLUICE_WORKER_SLOTS": "8"})

        doomed.kill_group(signal.SIGKILL)
        killed = time.monotonic()
        released.set()

        _wait_all_terminal(deployment, runs, BOUND_SECONDS - (time.monotonic() - killed))
        settled = _assert_settled(deployment, runs)
        _assert_each_decision_sent_at_most_once(provider, runs, 3)
        resumed = [run for run in settled if run["deliveries"] == 2]
        assert resumed
        # The two calls in flight when the worker died were not sent again.
        uncertain = [
            a for run in resumed for a in run["attempts"] if a["reason"] == "dispatch-unconfirmed"
        ]
        assert len(uncertain) == 2
        assert "back in the backlog" in survivor.log()
    finally:
        released.set()
        deployment.stop()
