"""A running worker admits under the limits of the latest activation or rollback.

The worker learns of a change through its listener (PostgreSQL LISTEN in `full` mode, polling
in `embedded` mode) without running a task, and through the task-start check when the listener
is off. The new profile (`demo-v2`) gives the fake provider `requestsPerMinute: 0`, which
admission refuses outright, so which profile admitted an attempt is plain to see.
"""

from __future__ import annotations

import pytest

from console.forms.runs import example_request

from .conftest import wait_for

pytestmark = pytest.mark.celery

ACTIVATE_V2 = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-v2")
document["providers"]["fake"]["requestsPerMinute"] = 0
print(demo_version_activate(document).kind)
"""

ROLL_BACK_TO_V1 = """
from django.contrib.auth import get_user_model
from admission import selectors
from admission.services import profiles as services
from admission.models import Workspace
users = get_user_model().objects
proposer, approver = users.get(username="demo-proposer"), users.get(username="demo-approver")
workspace = Workspace.objects.get(key="demo")
target = selectors.profile_version_get(workspace=workspace, label="demo-v1")
request = services.rollback_request_create(
    workspace=workspace, target=target, requested_by=proposer
)
print(services.rollback_request_approve(request=request, approver=approver).kind)
"""


def _statuses(run):
    return [decision["status"] for decision in run["result"]["decisions"]]


def _refresh_source(mode):
    return "notify" if mode == "full" else "poll"


def test_a_running_worker_switches_profiles_without_a_restart(deployment, mode):
    deployment.start_web()
    worker = deployment.start_worker({"SLUICE_PROFILE_POLL_SECONDS": "0.5"})

    before = deployment.wait_run(deployment.submit(example_request(3))["id"])
    assert before["profileVersion"] == "demo-v1"
    assert _statuses(before) == ["succeeded"] * 3

    assert deployment.django(ACTIVATE_V2).strip().endswith("change")
    line = f"profile refresh ({_refresh_source(mode)}): 1 workspace(s) now at demo-v2"
    # The worker hears of it on its own, before it is given any task.
    wait_for(lambda: line in worker.log(), 15, f"worker log line {line!r}")

    after = deployment.wait_run(deployment.submit(example_request(3))["id"])
    assert after["profileVersion"] == "demo-v2"
    assert _statuses(after) == ["rate-limited"] * 3
    for attempt in after["attempts"]:
        assert attempt["sent"] is False
        assert attempt["reason"] == "requests-per-minute"
        assert attempt["evidence"]["decision"] == "reject"

    assert deployment.django(ROLL_BACK_TO_V1).strip().endswith("rollback")
    line = f"profile refresh ({_refresh_source(mode)}): 1 workspace(s) now at demo-v1"
    wait_for(lambda: line in worker.log(), 15, f"worker log line {line!r}")
    rolled_back = deployment.wait_run(deployment.submit(example_request(3))["id"])
    assert rolled_back["profileVersion"] == "demo-v1"
    assert _statuses(rolled_back) == ["succeeded"] * 3


def test_an_activation_reaches_an_evaluation_while_it_runs(deployment):
    deployment.start_web()
    deployment.start_worker(
        {
            "SLUICE_PROFILE_POLL_SECONDS": "0.3",
            "SLUICE_ADAPTERS": deployment.adapters(latency_ms=500),
        }
    )
    submitted = deployment.submit(example_request(16))
    wait_for(lambda: len(deployment.adapter_calls()) >= 1, 30, "the first adapter call")
    deployment.django(ACTIVATE_V2)

    run = deployment.wait_run(submitted["id"])
    statuses = _statuses(run)
    # Admitted under demo-v1 until the change arrived, refused under demo-v2 after it.
    assert statuses[0] == "succeeded"
    assert statuses[-1] == "rate-limited"
    first_refused = statuses.index("rate-limited")
    assert statuses[first_refused:] == ["rate-limited"] * (16 - first_refused)
    assert len(deployment.adapter_calls()) == first_refused


def test_the_task_start_check_catches_up_when_nothing_listens(deployment):
    deployment.start_web()
    worker = deployment.start_worker(
        {"SLUICE_PROFILE_LISTEN": "0", "SLUICE_PROFILE_POLL_SECONDS": "3600"}
    )
    before = deployment.wait_run(deployment.submit(example_request(2))["id"])
    assert before["profileVersion"] == "demo-v1"

    deployment.django(ACTIVATE_V2)
    after = deployment.wait_run(deployment.submit(example_request(2))["id"])
    assert after["profileVersion"] == "demo-v2"
    assert _statuses(after) == ["rate-limited"] * 2
    assert "profile refresh (task-start): 1 workspace(s) now at demo-v2" in worker.log()
