"""The profile workflow and the rollout controls over REST, end to end, with the admin's rules:
roles, four eyes, typed refusals, audit rows, and the OpenAPI schema with examples."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from admission.models import ProfileApproval, ProfileChangeRecord, RolloutEvent
from admission.services import rollout
from tests.admission.conftest import ALL_CONFIRMED

pytestmark = pytest.mark.django_db

BASE = "/api/workspaces/acme"


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _error(response: Any, status: int, error_type: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["type"] == error_type, error
    return error


def _propose(client: APIClient, make_document: Any, label: str, **kwargs: Any) -> None:
    response = client.post(
        f"{BASE}/profiles/", {"document": make_document(label, **kwargs)}, format="json"
    )
    assert response.status_code == 201, response.content


def _approve(client: APIClient, label: str) -> Any:
    return client.post(
        f"{BASE}/profiles/{label}/approve/",
        {"checklist": ALL_CONFIRMED, "comment": "read the diff"},
        format="json",
    )


def test_the_whole_workflow_over_rest_with_four_eyes(
    workspace, proposer, approver, member, make_document
):
    pat, alex, mia = _client(proposer), _client(approver), _client(member)

    # Propose; the proposer cannot decide their own version.
    _propose(pat, make_document, "v1")
    error = _error(_approve(pat, "v1"), 403, "four_eyes")
    assert "a second person must decide it" in error["detail"]
    # A proposer-role member may not approve at all.
    _error(_approve(mia, "v1"), 403, "permission_denied")
    # Every checklist item, or a field error naming the checklist.
    partial = alex.post(
        f"{BASE}/profiles/v1/approve/",
        {"checklist": {"diff-reviewed": True}},
        format="json",
    )
    assert "checklist" in _error(partial, 400, "invalid")["fields"]
    approved = _approve(alex, "v1")
    assert approved.status_code == 200, approved.content
    assert approved.json()["status"] == "approved"
    assert approved.json()["approvals"][0]["approver"] == approver.username
    _error(_approve(alex, "v1"), 409, "conflict")
    assert ProfileApproval.objects.count() == 1

    # Activate: operators only; twice is a conflict.
    _error(mia.post(f"{BASE}/profiles/v1/activate/"), 403, "permission_denied")
    activated = pat.post(f"{BASE}/profiles/v1/activate/")
    assert activated.status_code == 201, activated.content
    assert activated.json()["kind"] == "initial"
    _error(pat.post(f"{BASE}/profiles/v1/activate/"), 409, "conflict")

    # Reject: four eyes, and a reason.
    _propose(pat, make_document, "v2", concurrency=5)
    _error(
        pat.post(f"{BASE}/profiles/v2/reject/", {"comment": "no"}, format="json"), 403, "four_eyes"
    )
    empty = alex.post(f"{BASE}/profiles/v2/reject/", {"comment": " "}, format="json")
    assert "comment" in _error(empty, 400, "invalid")["fields"]
    rejected = alex.post(f"{BASE}/profiles/v2/reject/", {"comment": "too wide"}, format="json")
    assert rejected.json()["status"] == "rejected"
    _error(pat.post(f"{BASE}/profiles/v2/activate/"), 409, "conflict")

    # A change, then a rollback requested by one operator and approved by another.
    _propose(pat, make_document, "v3", concurrency=7)
    assert _approve(alex, "v3").status_code == 200
    assert pat.post(f"{BASE}/profiles/v3/activate/").json()["kind"] == "change"
    no_reason = pat.post(f"{BASE}/rollbacks/", {"target": "v1", "reason": ""}, format="json")
    assert "reason" in _error(no_reason, 400, "invalid")["fields"]
    unknown = pat.post(f"{BASE}/rollbacks/", {"target": "v9", "reason": "x"}, format="json")
    assert "target" in _error(unknown, 400, "invalid")["fields"]
    requested = pat.post(
        f"{BASE}/rollbacks/", {"target": "v1", "reason": "v3 queues too much"}, format="json"
    )
    assert requested.status_code == 201, requested.content
    rollback_id = requested.json()["id"]
    assert requested.json()["status"] == "pending"
    again = pat.post(f"{BASE}/rollbacks/", {"target": "v1", "reason": "twice"}, format="json")
    _error(again, 409, "conflict")
    _error(pat.post(f"{BASE}/rollbacks/{rollback_id}/approve/"), 403, "four_eyes")
    rolled = alex.post(f"{BASE}/rollbacks/{rollback_id}/approve/", {"comment": "ok"}, format="json")
    assert rolled.status_code == 201, rolled.content
    assert (rolled.json()["kind"], rolled.json()["profileVersion"]) == ("rollback", "v1")
    _error(alex.post(f"{BASE}/rollbacks/{rollback_id}/approve/"), 409, "conflict")

    # A rollback that is turned down.
    second = pat.post(f"{BASE}/rollbacks/", {"target": "v3", "reason": "retry v3"}, format="json")
    second_id = second.json()["id"]
    _error(
        pat.post(f"{BASE}/rollbacks/{second_id}/reject/", {"comment": "no"}, format="json"),
        403,
        "four_eyes",
    )
    turned_down = alex.post(
        f"{BASE}/rollbacks/{second_id}/reject/", {"comment": "not now"}, format="json"
    )
    assert turned_down.json()["status"] == "rejected"
    listed = pat.get(f"{BASE}/rollbacks/").json()["results"]
    assert [(r["target"], r["status"]) for r in listed] == [
        ("v3", "rejected"),
        ("v1", "approved"),
    ]
    assert list(
        ProfileChangeRecord.objects.order_by("id").values_list("kind", "profile_version")
    ) == [("initial", "v1"), ("change", "v3"), ("rollback", "v1")]


def test_kill_switch_shadow_and_canary_over_rest(
    workspace, proposer, approver, member, make_document
):
    pat, alex, mia = _client(proposer), _client(approver), _client(member)
    for label, concurrency in (("v1", None), ("v2", 2)):
        _propose(pat, make_document, label, concurrency=concurrency)
        assert _approve(alex, label).status_code == 200
    pat.post(f"{BASE}/profiles/v1/activate/")

    # The kill switch: operators only, a reason to turn it off, no double flips.
    assert mia.get(f"{BASE}/scheduling/").json()["parallelScheduling"] == "allowed"
    _error(
        mia.post(f"{BASE}/scheduling/", {"enabled": False, "reason": "x"}, format="json"),
        403,
        "permission_denied",
    )
    unexplained = pat.post(f"{BASE}/scheduling/", {"enabled": False}, format="json")
    assert "reason" in _error(unexplained, 400, "invalid")["fields"]
    off = pat.post(
        f"{BASE}/scheduling/", {"enabled": False, "reason": "latency doubled"}, format="json"
    )
    assert off.status_code == 200, off.content
    assert off.json()["parallelScheduling"] == "off"
    assert off.json()["lastChange"]["reason"] == "latency doubled"
    _error(
        pat.post(f"{BASE}/scheduling/", {"enabled": False, "reason": "x"}, format="json"),
        409,
        "conflict",
    )
    assert not rollout.parallel_scheduling_allowed(workspace=workspace)
    on = alex.post(f"{BASE}/scheduling/", {"enabled": True}, format="json")
    assert on.json()["parallelScheduling"] == "allowed"

    # A shadow: approved versions only, one at a time, stopped once.
    _propose(pat, make_document, "v3", concurrency=3)
    unapproved = pat.post(f"{BASE}/shadow/", {"version": "v3"}, format="json")
    assert "version" in _error(unapproved, 400, "invalid")["fields"]
    current = pat.post(f"{BASE}/shadow/", {"version": "v1"}, format="json")
    assert "version" in _error(current, 400, "invalid")["fields"]
    _error(mia.post(f"{BASE}/shadow/", {"version": "v2"}, format="json"), 403, "permission_denied")
    started = pat.post(f"{BASE}/shadow/", {"version": "v2", "reason": "try"}, format="json")
    assert started.status_code == 201, started.content
    assert started.json()["running"]["profileVersion"] == "v2"
    assert started.json()["comparison"]["observations"] == 0
    _error(pat.post(f"{BASE}/shadow/", {"version": "v2"}, format="json"), 409, "conflict")
    seen = mia.get(f"{BASE}/shadow/").json()
    assert seen["running"]["kind"] == "shadow-start"
    assert {b["bound"] for b in seen["comparison"]["bounds"]} >= {"rejectedShare", "maxQueued"}
    stopped = alex.post(f"{BASE}/shadow/stop/", {"reason": "enough"}, format="json")
    assert stopped.json()["kind"] == "shadow-stop"
    assert stopped.json()["closes"] == started.json()["running"]["id"]
    _error(alex.post(f"{BASE}/shadow/stop/"), 409, "conflict")
    assert mia.get(f"{BASE}/shadow/").json() == {"running": None, "comparison": None}

    # A canary: principals and/or a fraction in (0, 1); promote makes it current.
    bad = pat.post(f"{BASE}/canary/", {"version": "v2", "fraction": 1.5}, format="json")
    assert "fraction" in _error(bad, 400, "invalid")["fields"]
    empty = pat.post(f"{BASE}/canary/", {"version": "v2"}, format="json")
    assert "principals" in _error(empty, 400, "invalid")["fields"]
    canary = pat.post(
        f"{BASE}/canary/", {"version": "v2", "principals": ["mia"], "fraction": 0.25}, format="json"
    )
    assert canary.status_code == 201, canary.content
    assert canary.json()["running"]["principals"] == ["mia"]
    assert canary.json()["running"]["fraction"] == 0.25
    _error(
        pat.post(f"{BASE}/canary/", {"version": "v2", "fraction": 0.1}, format="json"),
        409,
        "conflict",
    )
    promoted = alex.post(
        f"{BASE}/canary/promote/", {"reason": "no extra rejections"}, format="json"
    )
    assert promoted.status_code == 200, promoted.content
    assert (promoted.json()["kind"], promoted.json()["profileVersion"]) == ("change", "v2")
    _error(alex.post(f"{BASE}/canary/abandon/"), 409, "conflict")

    # Every control is on the audit, with who did it.
    events = mia.get(f"{BASE}/rollout-events/").json()["results"]
    assert [(e["kind"], e["actor"]) for e in reversed(events)] == [
        ("parallel-off", "pat"),
        ("parallel-on", "alex"),
        ("shadow-start", "pat"),
        ("shadow-stop", "alex"),
        ("canary-start", "pat"),
        ("canary-promote", "alex"),
    ]
    assert RolloutEvent.objects.count() == 6


def test_a_canary_abandoned_sends_runs_back_and_the_split_is_deterministic(
    workspace, proposer, approver, make_document
):
    pat, alex = _client(proposer), _client(approver)
    for label in ("v1", "v2"):
        _propose(pat, make_document, label, concurrency=None if label == "v1" else 4)
        _approve(alex, label)
    pat.post(f"{BASE}/profiles/v1/activate/")
    pat.post(f"{BASE}/canary/", {"version": "v2", "fraction": 0.3}, format="json")
    canary = rollout.canary_current(workspace=workspace)
    assert canary is not None
    ids = [f"inv-{n}" for n in range(2000)]
    chosen = [rollout.canary_routes(canary, principal_id="p", invocation_id=i) for i in ids]
    # The same run always lands on the same side, and about the asked share of runs does.
    assert chosen == [rollout.canary_routes(canary, principal_id="p", invocation_id=i) for i in ids]
    assert 0.26 < sum(chosen) / len(ids) < 0.34
    plan = rollout.run_plan(
        workspace=workspace, principal_id="p", invocation_id=ids[chosen.index(True)]
    )
    assert plan.on_canary and plan.describe(requested=True)["canary"] == "v2"
    # A run pinned to a profile revision stays on it.
    pinned = rollout.run_plan(
        workspace=workspace, principal_id="p", invocation_id=ids[chosen.index(True)], pinned=True
    )
    assert not pinned.on_canary
    plan = rollout.run_plan(
        workspace=workspace, principal_id="p", invocation_id=ids[chosen.index(False)]
    )
    assert not plan.on_canary and plan.describe(requested=True)["canary"] is None

    abandoned = pat.post(f"{BASE}/canary/abandon/", {"reason": "rejections"}, format="json")
    assert abandoned.json()["kind"] == "canary-abandon"
    plan = rollout.run_plan(
        workspace=workspace, principal_id="p", invocation_id=ids[chosen.index(True)]
    )
    assert plan.canary is None and not plan.on_canary
    # Abandoning changes no current version.
    assert ProfileChangeRecord.objects.count() == 1


def test_the_schema_documents_every_workflow_route_with_examples(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    schema = target.read_text()
    for route in (
        "/profiles/{profile_version}/approve/",
        "/profiles/{profile_version}/reject/",
        "/profiles/{profile_version}/activate/",
        "/rollbacks/",
        "/rollbacks/{rollback_id}/approve/",
        "/rollbacks/{rollback_id}/reject/",
        "/scheduling/",
        "/shadow/",
        "/shadow/stop/",
        "/canary/",
        "/canary/promote/",
        "/canary/abandon/",
        "/rollout-events/",
    ):
        assert f"/api/workspaces/{{workspace_key}}{route}" in schema, route
    for example in (
        "Approve under the runbook",
        "Four eyes",
        "Kill switch",
        "Shadow v3",
        "A tighter shadow",
        "Kill switch on",
    ):
        assert example in schema


def test_a_redelivered_run_keeps_the_setting_and_arm_it_started_with(
    workspace, proposer, approver, make_document
):
    pat, alex = _client(proposer), _client(approver)
    for label in ("v1", "v2"):
        _propose(pat, make_document, label, concurrency=None if label == "v1" else 4)
        _approve(alex, label)
    pat.post(f"{BASE}/profiles/v1/activate/")
    pat.post(f"{BASE}/canary/", {"version": "v2", "principals": ["quiet-1"]}, format="json")

    first = rollout.run_plan(
        workspace=workspace, principal_id="quiet-1", invocation_id="i-1", run_id="run-1"
    )
    assert first.parallel_allowed and first.on_canary
    # The switch turns and the canary is abandoned while run-1 is in flight...
    pat.post(f"{BASE}/scheduling/", {"enabled": False, "reason": "incident"}, format="json")
    pat.post(f"{BASE}/canary/abandon/", {"reason": "rejects"}, format="json")
    # ...a worker dies and run-1 is delivered again: it goes on as it started.
    again = rollout.run_plan(
        workspace=workspace, principal_id="quiet-1", invocation_id="i-1", run_id="run-1"
    )
    assert again.parallel_allowed and again.on_canary
    assert again.describe(requested=True)["canary"] == "v2"
    # A run that starts now gets the new setting and no canary.
    fresh = rollout.run_plan(
        workspace=workspace, principal_id="quiet-1", invocation_id="i-2", run_id="run-2"
    )
    assert not fresh.parallel_allowed and not fresh.on_canary
    assert fresh.describe(requested=True)["schedulerEnabled"] is False
