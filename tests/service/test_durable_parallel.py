"""Durable parallel runs with real processes: a web server, Celery workers on a real broker and a
loopback OpenAI-compatible provider that records every call and how many were in flight.

A run the service executes keeps a receipt with a slot per call in flight, so it runs at its
scheduler ceiling; a worker killed with eight calls out leaves eight slots, which the next claim
turns into `execution-uncertain` attempts without sending any of them again.
"""

from __future__ import annotations

import collections
import itertools
import signal
import threading
import time
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import Deployment, admission_redis_env, demo_provider_over_http, wait_for

pytestmark = pytest.mark.celery

RUNS = "/api/workspaces/demo/evaluations/"

ACTIVATE = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-durable", concurrency={workspace})
document["providers"]["fake"].update(concurrency={provider}, maxQueueWaitMs=60000)
for principal in document["principals"].values():
    principal.update(concurrency={workspace}, maxQueueWaitMs=60000)
print(demo_version_activate(document).kind)
"""


def _provider_env(server: LoopbackServer) -> dict[str, str]:
    # The demo profile's provider is `fake`: here it is an OpenAI-compatible HTTP endpoint.
    return {"SLUICE_ADAPTERS": demo_provider_over_http(server.base_url)}


def _parallel(decisions: int, ceiling: int, tag: str) -> dict[str, Any]:
    document = example_request(decisions)
    # Every prompt names its run and decision, so a repeated dispatch is visible.
    document["input"]["text"] = tag
    document["scheduler"] = {"enabled": True, "bindingConcurrency": ceiling}
    for decision in document["ruleset"]["decisions"]:
        decision["binding"]["primary"]["timeoutMs"] = 60_000
    return document


def _prompts(server: LoopbackServer) -> list[str]:
    return [request["body"]["messages"][-1]["content"] for request in server.requests]


def test_a_worker_killed_with_eight_calls_out_resumes_them_as_uncertain(deployment: Deployment):
    release = threading.Event()
    with LoopbackServer() as server:
        server.default = Reply(content="yes", hold=release, hold_seconds=60)
        try:
            env = {
                **_provider_env(server),
                # The dead worker's eight provider permits lapse after this (full mode).
                "SLUICE_ADMISSION_LEASE_TTL_MS": "2000",
                "SLUICE_ADMISSION_HEARTBEAT_MS": "200",
            }
            deployment.django(ACTIVATE.format(workspace=8, provider=8))
            deployment.start_web(env)
            first = deployment.start_worker(env)
            submitted = deployment.submit(_parallel(12, 8, "killed"))
            wait_for(lambda: len(server.requests) >= 8, 60, "eight calls at the provider")
            # The ceiling holds: nothing more goes out while the eight are held.
            time.sleep(0.5)
            assert len(server.requests) == 8 and server.in_flight == 8
            running = deployment.evaluation(submitted["id"])
            assert len(running["progress"]["inFlight"]) == 8
            assert running["progress"]["maxInFlight"] == 8

            first.kill_group(signal.SIGKILL)
            held = sorted(_prompts(server))
            # Later calls are answered at once; the eight held ones go to a dead worker.
            server.default = Reply(content="yes")
            release.set()
            deployment.start_worker(env)
            run = deployment.wait_run(submitted["id"], timeout=120)
        finally:
            release.set()

    assert run["status"] == "execution-uncertain", run
    assert run["deliveries"] == 2 and run["result"]["resumed"] is True
    statuses = collections.Counter(d["status"] for d in run["result"]["decisions"])
    assert statuses == {"execution-uncertain": 8, "succeeded": 4}
    uncertain = {a["decisionId"] for a in run["attempts"] if a["reason"] == "dispatch-unconfirmed"}
    assert len(uncertain) == 8
    assert all(a["sent"] for a in run["attempts"] if a["decisionId"] in uncertain)
    # None of the eight was sent again; the other four were sent once each.
    prompts = _prompts(server)
    assert len(prompts) == 12 and len(set(prompts)) == 12
    assert sorted(prompts[:8]) == held
    assert server.max_in_flight <= 8
    # Canonical order whatever order they finished in.
    assert [d["decisionId"] for d in run["result"]["decisions"]] == [
        f"check-{i}" for i in range(1, 13)
    ]


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_parallel_runs_on_two_workers_keep_the_providers_concurrency(deployment: Deployment):
    runs, decisions, provider_limit = 20, 10, 4
    with LoopbackServer() as server:
        server.default = Reply(content="yes", delay=0.05)
        env = {**_provider_env(server), **admission_redis_env(deployment)}
        deployment.django(ACTIVATE.format(workspace=16, provider=provider_limit))
        deployment.start_web(env)
        for _ in range(2):
            deployment.start_worker(env)
        submitted = [
            deployment.submit(_parallel(decisions, 8, f"run {index}"))["id"]
            for index in range(runs)
        ]
        finished = [deployment.wait_run(run_id, timeout=120) for run_id in submitted]

    assert [run["status"] for run in finished] == ["completed"] * runs
    prompts = _prompts(server)
    assert len(prompts) == runs * decisions and len(set(prompts)) == len(prompts)
    # Never more at the provider than its concurrency, across both workers and every run...
    assert server.max_in_flight == provider_limit
    # ...while runs did use their ceiling (the provider's, the smallest).
    assert all(run["result"]["concurrency"] == provider_limit for run in finished)
    assert max(run["result"]["maxActive"] for run in finished) > 1
    assert max(a["evidence"]["active"] for r in finished for a in r["attempts"]) <= provider_limit


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_the_kill_switch_set_during_a_run_makes_the_next_run_serial(deployment: Deployment):
    release = threading.Event()
    with LoopbackServer() as server:
        server.default = Reply(content="yes", hold=release, hold_seconds=60)
        try:
            env = {**_provider_env(server), **admission_redis_env(deployment)}
            deployment.django(ACTIVATE.format(workspace=8, provider=8))
            deployment.start_web(env)
            deployment.start_worker(env)
            running = deployment.submit(_parallel(6, 8, "before the switch"))["id"]
            wait_for(lambda: len(server.requests) >= 6, 60, "six calls at once")
            assert server.in_flight == 6
            response = deployment.api(
                "POST",
                "/api/workspaces/demo/scheduling/",
                json={"enabled": False, "reason": "provider degraded"},
            )
            assert response.status_code == 200, response.text
            release.set()
            first = deployment.wait_run(running)
        finally:
            release.set()
        server.default = Reply(content="yes", delay=0.1)
        server.max_in_flight = 0
        before = len(server.requests)
        second = deployment.wait_run(deployment.submit(_parallel(5, 8, "after the switch"))["id"])
        calls = len(server.requests) - before

    assert first["status"] == "completed" and first["result"]["maxActive"] == 6
    assert second["status"] == "completed"
    assert second["result"]["rollout"]["schedulerEnabled"] is False
    # One call at a time at the provider.
    assert calls == 5 and server.max_in_flight == 1
    arrivals = sorted(r["at"] for r in server.requests[before:])
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(arrivals))
