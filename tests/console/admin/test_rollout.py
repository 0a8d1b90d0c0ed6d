"""Rollout controls in the admin: the kill switch, a shadow with its comparison page, a canary
promoted, who may use them, and the audit rows they leave."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client

from admission import selectors
from admission.models import RolloutEvent
from admission.services import profiles as services
from admission.services import rollout

pytestmark = pytest.mark.django_db

CONTROLS = "/admin/admission/rolloutevent/controls/acme/"


def _login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.fixture
def active_and_candidate(approved, proposer, approver):
    current = approved("v1")
    services.profile_version_activate(version=current, actor=approver)
    return current, approved("v2", concurrency=2)


def test_an_operator_turns_the_kill_switch_off_and_on_with_a_reason(
    workspace, proposer, active_and_candidate
):
    client = _login(proposer)
    audit = client.get("/admin/admission/rolloutevent/").content.decode()
    assert 'href="/admin/admission/rolloutevent/controls/"' in audit
    page = client.get(CONTROLS)
    assert page.status_code == 200
    assert "Turn parallel scheduling off" in page.content.decode()
    refused = client.post(CONTROLS, {"op": "switch", "switch-enabled": "false"}, follow=True)
    assert "needs a reason" in " ".join(_messages(refused))
    assert rollout.parallel_scheduling_allowed(workspace=workspace)
    off = client.post(
        CONTROLS,
        {"op": "switch", "switch-enabled": "false", "switch-reason": "provider incident"},
        follow=True,
    )
    assert any("Kill switch on" in m for m in _messages(off))
    assert not rollout.parallel_scheduling_allowed(workspace=workspace)
    assert "Allow parallel scheduling again" in off.content.decode()
    client.post(CONTROLS, {"op": "switch", "switch-enabled": "true"}, follow=True)
    assert rollout.parallel_scheduling_allowed(workspace=workspace)
    events = list(
        RolloutEvent.objects.order_by("id").values_list("kind", "actor__username", "reason")
    )
    assert events == [("parallel-off", "pat", "provider incident"), ("parallel-on", "pat", "")]


def test_a_shadow_starts_shows_its_comparison_with_plots_and_stops(
    workspace, proposer, approver, active_and_candidate
):
    _current, candidate = active_and_candidate
    client = _login(proposer)
    started = client.post(
        CONTROLS,
        {"op": "shadow_start", "shadow-version": candidate.pk, "shadow-reason": "try"},
        follow=True,
    )
    assert any("Started v2 as the shadow" in m for m in _messages(started))
    shadow = rollout.shadow_current(workspace=workspace)
    assert shadow is not None and shadow.version == candidate
    # Two runs' worth of tallies: the shadow refused what reality admitted.
    for n in (3, 5):
        rollout.shadow_observation_record(
            session_id=shadow.pk,
            run_id=f"run-{n}",
            active={"requests": n, "admitted": n},
            shadow={"requests": n, "admitted": 2, "rejected": {"queue-full": n - 2}},
        )
    page = client.get(f"/admin/admission/rolloutevent/{shadow.pk}/comparison/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<div class="rollout-plot"><svg') == 3
    assert "worse: 50.0% against 0.0%" in html
    assert "4 more; shadow: queue-full 4" in html
    assert "The shadow is worse on at least one bound." in html
    controls = client.get(CONTROLS).content.decode()
    assert "Stop the shadow" in controls and "✗" in controls
    # The version's own page carries the evidence for its approver.
    version_page = client.get(f"/admin/admission/profileversion/{candidate.pk}/change/")
    assert "shadow since" in version_page.content.decode()
    assert "2 run(s), worse on: requests rejected" in version_page.content.decode()
    client.post(CONTROLS, {"op": "shadow_stop", "shadow_stop-reason": "done"}, follow=True)
    assert rollout.shadow_current(workspace=workspace) is None
    # The comparison stays readable after the stop.
    assert (
        "closed (shadow-stop)"
        in client.get(f"/admin/admission/rolloutevent/{shadow.pk}/comparison/").content.decode()
    )


def test_a_canary_for_principals_and_a_fraction_is_promoted(
    workspace, proposer, approver, active_and_candidate
):
    _current, candidate = active_and_candidate
    client = _login(approver)
    bad = client.post(
        CONTROLS,
        {"op": "canary_start", "canary-version": candidate.pk, "canary-fraction": "1"},
        follow=True,
    )
    assert any("above 0 and below 1" in m for m in _messages(bad))
    client.post(
        CONTROLS,
        {
            "op": "canary_start",
            "canary-version": candidate.pk,
            "canary-principals": "quiet-1, quiet-2",
            "canary-fraction": "0.2",
        },
        follow=True,
    )
    canary = rollout.canary_current(workspace=workspace)
    assert canary is not None
    assert (canary.principals, canary.fraction) == (["quiet-1", "quiet-2"], 0.2)
    assert "quiet-1, quiet-2" in client.get(CONTROLS).content.decode()
    promoted = client.post(
        CONTROLS, {"op": "canary_promote", "promote-reason": "clean"}, follow=True
    )
    assert any("v2 is current (change)" in m for m in _messages(promoted))
    assert selectors.workspace_current_version(workspace=workspace) == candidate
    kinds = list(RolloutEvent.objects.order_by("id").values_list("kind", flat=True))
    assert kinds == ["canary-start", "canary-promote"]


def test_only_operators_use_the_controls_and_outsiders_see_nothing(
    workspace, member, outsider, active_and_candidate
):
    member.is_staff = True
    member.save()
    reader = _login(member)
    page = reader.get(CONTROLS)
    assert page.status_code == 200
    assert "operators of acme use them" in page.content.decode()
    assert "Turn parallel scheduling off" not in page.content.decode()
    refused = reader.post(
        CONTROLS, {"op": "switch", "switch-enabled": "false", "switch-reason": "x"}
    )
    assert refused.status_code == 403
    assert rollout.parallel_scheduling_allowed(workspace=workspace)
    outsider.is_staff = True
    outsider.save()
    assert _login(outsider).get(CONTROLS).status_code in (403, 404)


def test_the_workspace_page_shows_profile_switch_shadow_and_canary(
    workspace, django_user_model, proposer, active_and_candidate
):
    _current, candidate = active_and_candidate
    rollout.shadow_start(version=candidate, actor=proposer)
    admin = django_user_model.objects.create_superuser("root", password="pw")
    html = _login(admin).get(f"/admin/admission/workspace/{workspace.pk}/change/").content.decode()
    assert "Parallel scheduling: <strong>allowed</strong>" in html
    assert "Shadow: <strong>v2</strong>" in html and "Canary: <strong>none</strong>" in html
    assert "v1" in html


def test_a_canary_comparison_counts_the_runs_of_each_side_with_plots(
    workspace, proposer, approver, active_and_candidate
):
    from evaluator.models import EvaluationRun

    _current, candidate = active_and_candidate
    canary = rollout.canary_start(version=candidate, actor=proposer, principals=["quiet-1"])
    admitted = {"sent": True, "number": 1, "evidence": {"decision": "admit", "queueDelayMs": 0}}
    refused = {
        "sent": False,
        "number": 1,
        "reason": "queue-full",
        "evidence": {"decision": "reject", "queueDelayMs": 0, "queued": 3},
    }
    for n, (version, attempts) in enumerate(
        [("v1", [admitted, admitted]), ("v2", [admitted, refused]), ("v1", [admitted])]
    ):
        run = EvaluationRun.objects.create(
            workspace=workspace,
            submitted_by=proposer,
            principal_id="quiet-1" if version == "v2" else "pat",
            invocation_id=f"inv-{n}",
            document={},
            ruleset_id="r",
            ruleset_digest="sha256:x",
            status="completed",
            profile_version=version,
            attempts=attempts,
        )
        EvaluationRun.objects.filter(pk=run.pk).update(
            started_at=canary.at + dt.timedelta(seconds=n + 1),
            finished_at=canary.at + dt.timedelta(seconds=n + 2),
        )
    html = _login(approver).get(f"/admin/admission/rolloutevent/{canary.pk}/comparison/")
    text = html.content.decode()
    assert "<th>current version</th><th>canary</th>" in text
    comparison = html.context["comparison"]
    assert comparison.observations == 3
    assert comparison.active["admitted"] == 3 and comparison.active["rejected"] == {}
    assert comparison.shadow["admitted"] == 1
    assert comparison.shadow["rejected"] == {"queue-full": 1}
    assert comparison.series == [(1, 0, 0), (2, 0, 1), (3, 0, 1)]
    assert text.count('<div class="rollout-plot"><svg') == 3
    assert "Rejected requests as the runs add up" in text
    assert "worse: 50.0% against 0.0%" in text
