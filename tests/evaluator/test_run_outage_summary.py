"""A run whose admissions met an outage says so where a client reads its status: the API's
`progress` (refusals by reason, and what the outage did) and the admin's progress line. The
worker's side (a real Redis stopped mid-run) is in tests/service/test_admission_outage.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from admission.models import Workspace
from console.admin.runs import EvaluationRunAdmin
from console.forms.runs import example_request
from evaluator.engine.outcomes import AttemptRecord
from evaluator.models import EvaluationRun

pytestmark = pytest.mark.django_db

RUNS = "/api/workspaces/demo/evaluations/"


@pytest.fixture
def client(demo: Workspace) -> APIClient:
    user = get_user_model().objects.create_user(username="mia")
    demo.members.add(user, through_defaults={"role": "member"})
    api = APIClient()
    api.force_authenticate(user)
    return api


def _attempt(decision_id: str, **fields: Any) -> dict[str, Any]:
    record = AttemptRecord(
        target_index=0, adapter_id="fake", model="demo-model", number=1, **fields
    )
    return {"decisionId": decision_id, **record.to_dict()}


def test_a_run_that_waited_out_an_outage_says_so_in_its_progress_and_admin_page(client):
    run_id = client.post(RUNS, example_request(3), format="json").json()["id"]
    reject = {"decision": "reject", "reason": "coordination-unavailable"}
    attempts = [
        # Waited 4 s through 7 refusals, then admitted and answered.
        _attempt(
            "check-1",
            sent=True,
            outcome="succeeded",
            reason="answered",
            evidence={"decision": "admit", "reason": "admitted"},
            infrastructure_refusals={"coordination-unavailable": 7},
            infrastructure_wait_ms=4000.0,
        ),
        # Its deadline passed while it waited: unanswered.
        _attempt(
            "check-2",
            sent=False,
            outcome="timeout",
            reason="coordination-unavailable",
            evidence=reject,
            infrastructure_refusals={"coordination-unavailable": 5},
            infrastructure_wait_ms=3000.0,
        ),
        # An ordinary refusal by the profile, counted by its own reason.
        _attempt(
            "check-3",
            sent=False,
            outcome="overloaded",
            reason="queue-full",
            evidence={"decision": "reject", "reason": "queue-full"},
        ),
    ]
    statuses = ["succeeded", "timeout", "overloaded"]
    EvaluationRun.objects.filter(pk=run_id).update(
        status="completed",
        attempts=attempts,
        result={
            "status": "completed",
            "decisions": [
                {"decisionId": f"check-{i + 1}", "status": status, "output": None}
                for i, status in enumerate(statuses)
            ],
        },
    )

    progress = client.get(f"{RUNS}{run_id}/").json()["progress"]
    assert progress["refusals"] == {"coordination-unavailable": 12, "queue-full": 1}
    assert progress["outage"] == {
        "refusals": {"coordination-unavailable": 12},
        "decisionsDelayed": 2,
        "decisionsUnanswered": 1,
        "waitedMs": 7000.0,
    }
    assert progress["outcomes"] == {"overloaded": 1, "succeeded": 1, "timeout": 1}

    line = EvaluationRunAdmin(EvaluationRun, admin.site).progress(
        EvaluationRun.objects.get(pk=run_id)
    )
    assert "admission refusals: 12 coordination-unavailable, 1 queue-full" in line
    assert "outage: 2 decisions waited 7.0 s for admission, 1 ended unanswered" in line


def test_a_run_that_met_no_outage_has_none(client):
    run_id = client.post(RUNS, example_request(1), format="json").json()["id"]
    progress = client.get(f"{RUNS}{run_id}/").json()["progress"]
    assert progress["refusals"] == {}
    assert progress["outage"] is None
