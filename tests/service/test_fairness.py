"""Fair dispatch between tenants, with real processes: a burst of one workspace does not hold
back another workspace's evaluation beyond its fair share."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import Deployment, demo_provider_over_http, wait_for

pytestmark = pytest.mark.celery

QUIET_WORKSPACE = """
from django.contrib.auth import get_user_model
from admission.models import Workspace, WorkspaceMembership
from config.demo import _activate_demo_profile
users = get_user_model().objects
proposer, approver = users.get(username="demo-proposer"), users.get(username="demo-approver")
quiet = Workspace.objects.create(key="quiet", name="Quiet tenant")
for user in (proposer, approver):
    WorkspaceMembership.objects.create(workspace=quiet, user=user, role="operator")
_activate_demo_profile(quiet, proposer, approver)
"""


def _when(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _quiet_run(deployment: Deployment) -> dict[str, Any]:
    """Submit one 1-decision evaluation in the quiet workspace; returns it once it ended."""
    path = "/api/workspaces/quiet/evaluations/"
    response = deployment.api("POST", path, json=example_request(1), user="demo-approver")
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = deployment.api("GET", f"{path}{run_id}/", user="demo-approver").json()
        if run["status"] == "completed":
            return dict(run)
        assert run["status"] in ("queued", "running"), run
        time.sleep(0.05)
    raise AssertionError(f"the quiet run did not finish: {run}")


def _latency(run: dict[str, Any]) -> float:
    return _when(run["finishedAt"]) - _when(run["createdAt"])


def test_a_quiet_tenant_is_not_held_back_by_another_tenants_burst(deployment: Deployment) -> None:
    deployment.django(QUIET_WORKSPACE)
    deployment.start_web()
    deployment.start_worker({"SLUICE_ADAPTERS": deployment.adapters(latency_ms=200)})
    # Warm: the worker has its registry and connections before anything is measured.
    _quiet_run(deployment)
    idle = _latency(_quiet_run(deployment))

    # 100 evaluations x 5 decisions of 200 ms at the demo's 4 concurrent calls: 25 s of work.
    burst = [deployment.submit(example_request(5))["id"] for _ in range(100)]
    time.sleep(1)
    loaded = _latency(_quiet_run(deployment))

    assert loaded <= 3 * idle + 1.0, f"idle {idle:.3f} s, behind the burst {loaded:.3f} s"
    # The burst was still there: the quiet run did not simply come after it.
    statuses = [deployment.evaluation(run_id)["status"] for run_id in burst[-10:]]
    assert "queued" in statuses or "running" in statuses


NARROW_DEMO = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-one-at-a-time")
for part in [document["workspace"], *document["providers"].values(),
             *document["principals"].values()]:
    part.update(concurrency=1)
demo_version_activate(document)
"""


def test_runs_waiting_for_admission_hold_no_worker_slot(deployment: Deployment) -> None:
    with LoopbackServer() as provider:
        released = threading.Event()
        # The first call is held at the provider: its run keeps the demo workspace's one permit.
        provider.replies.append(Reply(hold=released))
        adapters = demo_provider_over_http(provider.base_url)
        deployment.env["SLUICE_ADAPTERS"] = adapters
        deployment.django(QUIET_WORKSPACE)
        deployment.django(NARROW_DEMO)
        deployment.start_web()
        deployment.start_worker({"SLUICE_WORKER_SLOTS": "2"})
        try:
            holder = deployment.submit(example_request(1))["id"]
            wait_for(lambda: len(provider.requests) == 1, 30, "the held call")
            # Three more runs of the workspace wait for its permit; two slots would be full
            # if waiting held one.
            waiting = [deployment.submit(example_request(1))["id"] for _ in range(3)]
            wait_for(
                lambda: all(deployment.evaluation(r)["status"] == "running" for r in waiting),
                30,
                "the waiting runs to be claimed",
            )
            run = _quiet_run(deployment)
            assert run["status"] == "completed"
            assert deployment.evaluation(holder)["status"] == "running"
            assert len(provider.requests) == 2
        finally:
            released.set()
        for run_id in [holder, *waiting]:
            assert deployment.wait_run(run_id)["status"] == "completed"
