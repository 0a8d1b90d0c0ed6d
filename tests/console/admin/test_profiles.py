"""Admin workflow through Django's test client: forms, actions, permissions, read-only audit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client
from django.urls import reverse

from admission.models import ProfileApproval, ProfileChangeRecord, ProfileVersion, RollbackRequest
from admission.services import profiles as services
from tests.admission.conftest import ALL_CONFIRMED

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/admission/profileversion/add/"
VERSIONS_URL = "/admin/admission/profileversion/"
ROLLBACKS_URL = "/admin/admission/rollbackrequest/"
CHECKS = {f"check_{key}": "on" for key in ALL_CONFIRMED}


def _login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _act(client: Client, url: str, action: str, objects: list[Any], **extra: Any) -> Any:
    data = {"action": action, ACTION_CHECKBOX_NAME: [obj.pk for obj in objects], **extra}
    return client.post(url, data, follow=True)


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_propose_page_has_a_monospace_json_editor_and_the_runbook_link(workspace, proposer):
    response = _login(proposer).get(ADD_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="profile-json"' in html and "monospace" in html
    assert reverse("admission:runbook", args=["RUN-JEV-ADMISSION-v1"]) in html


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"profileVersion": "v1"}', "workspace: is required"),
    ],
)
def test_propose_page_shows_bad_documents_on_the_field(workspace, proposer, text, message):
    response = _login(proposer).post(ADD_URL, {"workspace": workspace.pk, "document": text})
    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors["document"])
    assert not ProfileVersion.objects.exists()


def test_propose_page_shows_the_core_error_naming_the_field(workspace, proposer, make_document):
    document = make_document("v1")
    document["providers"]["jev"]["circuitBreaker"]["failureThreshold"] = 0
    response = _login(proposer).post(
        ADD_URL, {"workspace": workspace.pk, "document": json.dumps(document)}
    )
    (error,) = response.context["form"].errors["document"]
    assert error.startswith("providers.jev.circuitBreaker.failureThreshold: ")
    assert b"providers.jev.circuitBreaker.failureThreshold" in response.content


def test_propose_preview_diffs_against_the_current_version(
    workspace, proposer, approver, approved, make_document
):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    client = _login(proposer)
    document = json.dumps(make_document("v2", concurrency=2))
    preview = client.post(
        ADD_URL, {"workspace": workspace.pk, "document": document, "_preview": "1"}
    )
    html = preview.content.decode()
    assert '<span class="diff-del">-    &quot;concurrency&quot;: 4,</span>' in html
    assert '<span class="diff-add">+    &quot;concurrency&quot;: 2,</span>' in html
    assert ProfileVersion.objects.count() == 1

    saved = client.post(ADD_URL, {"workspace": workspace.pk, "document": document}, follow=True)
    version = ProfileVersion.objects.get(profile_version="v2")
    assert version.proposed_by == proposer
    assert saved.redirect_chain[-1][0] == reverse(
        "admin:admission_profileversion_change", args=[version.pk]
    )
    view_html = saved.content.decode()
    assert "diff-add" in view_html  # the view page diffs against the current version too
    assert "Proposed acme:v2" in " ".join(_messages(saved))


def test_propose_page_refuses_a_taken_label(workspace, proposer, approved, make_document):
    approved("v1")
    response = _login(proposer).post(
        ADD_URL,
        {"workspace": workspace.pk, "document": json.dumps(make_document("v1", concurrency=3))},
    )
    assert "already exists with other limits" in response.context["form"].errors["document"][0]


def test_propose_page_offers_only_workspaces_where_the_user_may_propose(
    workspace, other_workspace, make_user
):
    staff = make_user("staffer")
    workspace.members.add(staff, through_defaults={"role": "proposer"})
    other_workspace.members.add(staff, through_defaults={"role": "viewer"})
    form = _login(staff).get(ADD_URL).context["form"]
    assert list(form.fields["workspace"].queryset) == [workspace]


def test_version_page_is_read_only_with_the_approval_inline(workspace, approved, proposer):
    version = approved("v1")
    response = _login(proposer).get(
        reverse("admin:admission_profileversion_change", args=[version.pk])
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="_save"' not in html
    assert "RUN-JEV-ADMISSION-v1" in html and "alex" in html
    assert version.profile_digest in html


def test_approve_action_shows_the_checklist_then_approves(
    workspace, proposer, approver, make_document
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    client = _login(approver)
    page = _act(client, VERSIONS_URL, "approve_selected", [version])
    html = page.content.decode()
    assert "RUN-JEV-ADMISSION-v1" in html and 'id="runbook-link"' in html
    for _, question in services.RUNBOOK_CHECKLIST:
        assert question.split(" ")[0] in html

    incomplete = _act(client, VERSIONS_URL, "approve_selected", [version], post="yes")
    assert incomplete.context["form"].errors
    assert not ProfileApproval.objects.exists()

    done = _act(
        client, VERSIONS_URL, "approve_selected", [version], post="yes", comment="ok", **CHECKS
    )
    assert "Approved acme:v1." in _messages(done)
    approval = ProfileApproval.objects.get()
    assert (approval.approver, approval.decision, approval.checklist) == (
        approver,
        "approve",
        ALL_CONFIRMED,
    )


def test_each_failure_of_an_action_is_reported(workspace, proposer, approver, make_document):
    mine = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=approver
    )
    theirs = services.profile_version_propose(
        workspace=workspace, document=make_document("v2", concurrency=2), proposed_by=proposer
    )
    done = _act(
        _login(approver), VERSIONS_URL, "approve_selected", [mine, theirs], post="yes", **CHECKS
    )
    messages = _messages(done)
    assert any("acme:v1" in m and "second person" in m for m in messages)
    assert "Approved acme:v2." in messages


def test_reject_action_needs_a_comment(workspace, proposer, approver, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    client = _login(approver)
    missing = _act(client, VERSIONS_URL, "reject_selected", [version], post="yes")
    assert "comment" in missing.context["form"].errors
    done = _act(client, VERSIONS_URL, "reject_selected", [version], post="yes", comment="too wide")
    assert "Rejected acme:v1." in _messages(done)


def test_activate_and_rollback_actions(workspace, proposer, approver, approved):
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    client = _login(approver)
    done = _act(client, VERSIONS_URL, "activate_selected", [v2, v1])
    # Activated oldest first: v1 initial, then v2 change.
    assert _messages(done) == ["Activated acme:v1 (initial).", "Activated acme:v2 (change)."]
    again = _act(client, VERSIONS_URL, "activate_selected", [v2])
    assert "already the current version" in _messages(again)[0]

    requested = _act(
        _login(proposer), VERSIONS_URL, "request_rollback", [v1], post="yes", reason="v2 is slow"
    )
    assert "second operator" in _messages(requested)[0]
    request = RollbackRequest.objects.get()

    own = _act(_login(proposer), ROLLBACKS_URL, "approve_rollbacks", [request])
    # Refused up front, with the reason, and no checklist page.
    assert _messages(own) == [
        "Not offered: you requested rollback to acme:v1 (pending), so a second person must "
        "decide it (four-eyes rule of RUN-JEV-ADMISSION-v1)."
    ]
    assert "decision_form" not in own.content.decode()
    approved_page = _act(client, ROLLBACKS_URL, "approve_rollbacks", [request], post="yes")
    assert _messages(approved_page) == ["Rolled acme back to v1."]
    assert ProfileChangeRecord.objects.order_by("-id").first().kind == "rollback"


def test_workflow_actions_need_a_role_that_allows_them(workspace, make_user, approved):
    viewer = make_user("viewer", permissions=("approve_profileversion", "activate_profileversion"))
    workspace.members.add(viewer, through_defaults={"role": "viewer"})
    client = _login(viewer)
    assert client.get(VERSIONS_URL).context["action_form"] is None  # no action offered
    refused = _act(client, VERSIONS_URL, "activate_selected", [approved("v1")])
    assert not ProfileChangeRecord.objects.exists()
    assert refused.status_code == 200


def test_version_actions_for_a_full_operator(workspace, proposer):
    choices = _login(proposer).get(VERSIONS_URL).context["action_form"].fields["action"].choices
    assert [name for name, _ in choices if name] == [
        "approve_selected",
        "reject_selected",
        "activate_selected",
        "request_rollback",
        "run_what_if",
    ]


@pytest.mark.parametrize(
    "url",
    ["/admin/admission/profilechangerecord/", "/admin/admission/profileapproval/"],
)
def test_audit_rows_are_read_only_in_the_admin(workspace, approver, approved, url):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    client = _login(approver)
    listing = client.get(url)
    assert listing.status_code == 200
    assert "delete_selected" not in listing.content.decode()
    assert listing.context["cl"].has_filters
    assert client.get(url + "add/").status_code == 403
    row = listing.context["cl"].result_list[0]
    detail = client.get(f"{url}{row.pk}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in detail.content.decode()
    assert client.post(f"{url}{row.pk}/delete/").status_code == 403


def test_change_record_list_filters_by_kind(workspace, approver, approved):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    client = _login(approver)
    assert (
        client.get("/admin/admission/profilechangerecord/?kind=initial").context["cl"].result_count
        == 1
    )
    assert (
        client.get("/admin/admission/profilechangerecord/?kind=rollback").context["cl"].result_count
        == 0
    )


def test_runbook_is_served_as_preformatted_text(client, proposer):
    url = reverse("admission:runbook", args=["RUN-JEV-ADMISSION-v1"])
    assert client.get(url).status_code == 302  # login first
    client.force_login(proposer)
    response = client.get(url)
    assert response.status_code == 200
    assert b'<pre id="runbook"># RUN-JEV-ADMISSION-v1' in response.content
    assert client.get("/runbooks/RUN-NOPE-v9/").status_code == 404
    assert client.get("/runbooks/..%2Fsettings/").status_code == 404


@pytest.fixture
def superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")
