"""Rollout controls in a running deployment: the kill switch holds from the next run boundary
(a run in flight keeps its setting), a shadow records what a tighter profile would have done
with the same runs while reality admits as before, and a canary takes its principals' runs."""

from __future__ import annotations

import time

import pytest

from console.forms.runs import example_request

pytestmark = pytest.mark.celery

BASE = "/api/workspaces/demo"

# demo-v2: the fake provider takes one request a minute and queues nothing.
PROPOSE_TIGHT = """
from config.demo import demo_profile, demo_version_approve
document = demo_profile("demo-v2")
document["providers"]["fake"]["requestsPerMinute"] = 1
document["providers"]["fake"]["maxQueueLength"] = 0
print(demo_version_approve(document).profile_version)
"""


def _parallel(decisions: int) -> dict:
    document = example_request(decisions)
    document["scheduler"] = {"enabled": True, "bindingConcurrency": decisions}
    return document


def _post(deployment, path, body, *, user="demo-proposer", status=200):
    response = deployment.api("POST", BASE + path, json=body, user=user)
    assert response.status_code == status, response.text
    return response.json()


def test_kill_switch_shadow_and_canary_in_a_running_deployment(deployment):
    # Both modes: in `full` admission is deployment-wide (Redis); the shadow and the canary
    # are per process either way.
    deployment.start_web()
    deployment.start_worker({"SLUICE_ADAPTERS": deployment.adapters(latency_ms=300)})

    # A run starts while parallel scheduling is allowed...
    in_flight = deployment.submit(_parallel(6))["id"]
    deadline = time.monotonic() + 60
    while deployment.evaluation(in_flight)["status"] != "running":
        assert time.monotonic() < deadline, "the first run never started"
        time.sleep(0.05)
    # ...and the kill switch is turned on while it runs.
    state = _post(deployment, "/scheduling/", {"enabled": False, "reason": "latency doubled"})
    assert state["parallelScheduling"] == "off"
    after = deployment.submit(_parallel(2))["id"]
    first = deployment.wait_run(in_flight)
    second = deployment.wait_run(after)
    # The run in flight finished under the setting it started with; the next one did not.
    assert first["result"]["rollout"]["parallelScheduling"] == "allowed"
    assert first["result"]["rollout"]["schedulerEnabled"] is True
    assert second["result"]["rollout"]["parallelScheduling"] == "off"
    assert second["result"]["rollout"]["schedulerEnabled"] is False
    assert second["result"]["rollout"]["schedulerRequested"] is True
    assert second["result"]["maxActive"] == 1
    _post(deployment, "/scheduling/", {"enabled": True}, user="demo-approver")
    again = deployment.wait_run(deployment.submit(_parallel(2))["id"])
    assert again["result"]["rollout"]["schedulerEnabled"] is True

    # A shadow of the tighter demo-v2: reality is untouched, the shadow record is not.
    assert deployment.django(PROPOSE_TIGHT).strip() == "demo-v2"
    started = _post(deployment, "/shadow/", {"version": "demo-v2"}, status=201)
    assert started["running"]["profileVersion"] == "demo-v2"
    shadowed = deployment.wait_run(deployment.submit(example_request(3))["id"])
    assert [d["status"] for d in shadowed["result"]["decisions"]] == ["succeeded"] * 3
    assert shadowed["result"]["rollout"]["shadow"] == "demo-v2"
    assert all(attempt["sent"] for attempt in shadowed["attempts"])
    comparison = deployment.api("GET", BASE + "/shadow/").json()["comparison"]
    assert comparison["observations"] == 1
    assert comparison["active"]["admitted"] == 3 and comparison["active"]["rejected"] == {}
    assert comparison["shadow"]["admitted"] == 1
    assert comparison["shadow"]["rejected"] == {"queue-full": 2}
    verdicts = {bound["bound"]: bound for bound in comparison["bounds"]}
    assert verdicts["rejectedShare"]["pass"] is False
    assert verdicts["rejectedShare"]["verdict"].startswith("worse")
    assert comparison["passed"] is False
    _post(deployment, "/shadow/stop/", {"reason": "seen enough"})

    # A canary of demo-v2 for demo-approver's runs only.
    _post(
        deployment, "/canary/", {"version": "demo-v2", "principals": ["demo-approver"]}, status=201
    )
    on_canary = deployment.wait_run(
        deployment.submit(example_request(2), user="demo-approver")["id"]
    )
    elsewhere = deployment.wait_run(deployment.submit(example_request(2))["id"])
    assert on_canary["profileVersion"] == "demo-v2"
    assert on_canary["result"]["rollout"]["canary"] == "demo-v2"
    # Under demo-v2 the second decision finds the bucket empty and no queue.
    assert [d["status"] for d in on_canary["result"]["decisions"]] == ["succeeded", "overloaded"]
    assert elsewhere["profileVersion"] == "demo-v1"
    assert elsewhere["result"]["rollout"]["canary"] is None
    canary = deployment.api("GET", BASE + "/canary/").json()
    assert canary["comparison"]["shadow"]["rejected"] == {"queue-full": 1}
    abandoned = _post(deployment, "/canary/abandon/", {"reason": "rejects"}, user="demo-approver")
    assert abandoned["kind"] == "canary-abandon"
    back = deployment.wait_run(deployment.submit(example_request(1), user="demo-approver")["id"])
    assert back["profileVersion"] == "demo-v1"
