"""Workspace-scoped authorization (admission.access): the rule itself, and that the admin, the
API and `manage.py profiles` all keep a user of workspace A out of workspace B."""

from __future__ import annotations

import io
import os
from typing import Any
from unittest import mock

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from knox.models import AuthToken
from rest_framework.test import APIClient

from admission import access
from admission.models import (
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)
from admission.services import profiles as services
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, LoadRun, Receipt
from tests.admission.conftest import ALL_CONFIRMED

pytestmark = pytest.mark.django_db

SECRET_INPUT = "globex-secret-merger-terms"


# ------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("role", "acts"),
    [
        ("viewer", {"view"}),
        ("member", {"view", "evaluate"}),
        ("proposer", {"view", "evaluate", "propose"}),
        ("approver", {"view", "evaluate", "propose", "approve"}),
        (
            "operator",
            {
                "view",
                "evaluate",
                "propose",
                "approve",
                "activate",
                "run-load",
                "operate",
                "cancel-runs",
            },
        ),
    ],
)
def test_each_role_grants_its_acts_in_its_workspace_only(
    make_user, workspace, other_workspace, role, acts
):
    user = make_user("rita", permissions=("approve_profileversion", "activate_profileversion"))
    workspace.members.add(user, through_defaults={"role": role})
    assert access.acts_of(user, workspace) == acts
    assert access.acts_of(user, other_workspace) == frozenset()
    for act in access.ACTS:
        assert access.can(user, act, workspace) is (act in acts)
        assert access.can(user, act, other_workspace) is False
        expected = [workspace] if act in acts else []
        assert list(access.workspaces_for(user, act)) == expected


def test_require_raises_a_typed_refusal_naming_act_and_workspace(make_user, workspace):
    viewer = make_user("vic")
    workspace.members.add(viewer, through_defaults={"role": "viewer"})
    with pytest.raises(access.AccessDenied) as caught:
        access.require(viewer, access.APPROVE, workspace)
    assert caught.value.act == "approve"
    assert caught.value.workspace_key == "acme"
    assert str(caught.value) == "you may not approve or reject changes in workspace acme"


def test_superusers_staff_and_inactive_users_hold_no_act_without_a_membership(
    django_user_model, make_user, workspace
):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    gone = make_user("gone")
    workspace.members.add(gone, through_defaults={"role": "operator"})
    gone.is_active = False
    gone.save()
    for user in (root, gone):
        assert not any(access.can(user, act, workspace) for act in access.ACTS)
        assert not access.workspaces_for(user, access.VIEW).exists()


def test_unknown_acts_are_a_programming_error(make_user, workspace):
    with pytest.raises(KeyError):
        access.can(make_user("x"), "delete-everything", workspace)


# ------------------------------------------------------------ two tenants, one operator each


@pytest.fixture
def globex(make_user, make_document) -> dict[str, Any]:
    """Workspace B with everything the admin shows: versions active, superseded, pending and
    approved-ready, their approvals and change records, a pending rollback request, an
    evaluation run, a receipt and a load run."""
    bob, cid = make_user("bob"), make_user("cid")
    workspace = Workspace.objects.create(key="globex", name="Globex Secret Project")
    workspace.members.add(bob, cid, through_defaults={"role": "operator"})
    first = services.profile_version_propose(
        workspace=workspace, document=make_document("globex-v1"), proposed_by=bob
    )
    services.profile_version_approve(version=first, approver=cid, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=first, actor=cid)
    second = services.profile_version_propose(
        workspace=workspace, document=make_document("globex-v2", concurrency=2), proposed_by=bob
    )
    services.profile_version_approve(version=second, approver=cid, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=second, actor=cid)
    rollback = services.rollback_request_create(
        workspace=workspace, target=first, requested_by=bob, reason="globex-reason"
    )
    pending = services.profile_version_propose(
        workspace=workspace, document=make_document("globex-v3", concurrency=3), proposed_by=bob
    )
    ready = services.profile_version_propose(
        workspace=workspace, document=make_document("globex-v4", concurrency=4), proposed_by=bob
    )
    services.profile_version_approve(version=ready, approver=cid, checklist=ALL_CONFIRMED)
    document = {**example_request(1), "input": {"text": SECRET_INPUT}}
    run = EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=bob,
        principal_id="bob",
        invocation_id="globex-invocation",
        document=document,
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "c" * 64,
    )
    receipt = Receipt.objects.create(
        workspace_id="globex",
        principal_id="bob",
        invocation_id="globex-invocation",
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "c" * 64,
        revision=1,
        document={"input": SECRET_INPUT},
    )
    load = LoadRun.objects.create(
        workspace=workspace, submitted_by=bob, manifest_name="globex-manifest", target="evaluator"
    )
    return {
        "workspace": workspace,
        "version": first,
        "approved": second,
        "pending": pending,
        "ready": ready,
        "approval": ProfileApproval.objects.get(version=first),
        "record": ProfileChangeRecord.objects.filter(workspace=workspace).first(),
        "rollback": rollback,
        "run": run,
        "receipt": receipt,
        "load": load,
    }


@pytest.fixture
def ann(make_user, workspace) -> Any:
    """A staff operator of acme only, holding every global permission there is."""
    from django.contrib.auth.models import Permission

    user = make_user("ann")
    user.user_permissions.add(*Permission.objects.all())
    workspace.members.add(user, through_defaults={"role": "operator"})
    return user


def _admin(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


CHECKS = {f"check_{key}": "on" for key in ALL_CONFIRMED}


def _act(client: Client, model: str, action: str, row: Any, **extra: str) -> Any:
    """Run an admin action on one row, answering its confirmation page's form too."""
    data = {"action": action, ACTION_CHECKBOX_NAME: [row.pk], "post": "yes", **extra}
    return client.post(f"/admin/admission/{model}/", data, follow=True)


ADMIN_PAGES = [
    ("evaluator/evaluationrun", "run", "globex-invocation"),
    ("evaluator/receipt", "receipt", "globex-invocation"),
    ("evaluator/loadrun", "load", "globex-manifest"),
    ("admission/profileversion", "version", "globex-v1"),
    ("admission/profileapproval", "approval", "globex-v1"),
    ("admission/profilechangerecord", "record", "globex-v2"),
    ("admission/rollbackrequest", "rollback", "globex-v1"),
]


@pytest.mark.parametrize(("path", "row", "marker"), ADMIN_PAGES)
def test_admin_lists_and_pages_show_nothing_of_another_workspace(ann, globex, path, row, marker):
    client = _admin(ann)
    listing = client.get(f"/admin/{path}/")
    assert listing.status_code == 200
    assert listing.context["cl"].result_count == 0
    html = listing.content.decode()
    assert marker not in html and "globex" not in html
    page = client.get(f"/admin/{path}/{globex[row].pk}/change/", follow=True)
    assert page.redirect_chain and page.redirect_chain[-1][0] == "/admin/"
    assert marker not in page.content.decode()
    assert SECRET_INPUT not in page.content.decode()


def test_admin_lists_show_the_users_own_workspace(ann, globex, approved, approver):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    listing = _admin(ann).get("/admin/admission/profileversion/")
    assert [str(v) for v in listing.context["cl"].result_list] == ["acme:v1"]


def test_admin_actions_cannot_reach_another_workspaces_versions(ann, globex):
    client = _admin(ann)
    _act(client, "profileversion", "approve_selected", globex["pending"], **CHECKS)
    _act(client, "profileversion", "activate_selected", globex["ready"])
    _act(client, "rollbackrequest", "approve_rollbacks", globex["rollback"])
    assert not ProfileApproval.objects.filter(version=globex["pending"]).exists()
    assert not ProfileChangeRecord.objects.filter(actor=ann).exists()
    globex["rollback"].refresh_from_db()
    assert globex["rollback"].status == RollbackRequest.Status.PENDING


def test_admin_forms_refuse_another_workspace(ann, globex, make_document):
    client = _admin(ann)
    globex_pk = globex["workspace"].pk
    propose = client.post(
        "/admin/admission/profileversion/add/",
        {"workspace": globex_pk, "document": '{"profileVersion": "x"}'},
    )
    assert "workspace" in propose.context["form"].errors
    evaluate = client.post(
        "/admin/evaluator/evaluationrun/add/", {"workspace": globex_pk, "document": "{}"}
    )
    assert "workspace" in evaluate.context["form"].errors
    load = client.post(
        "/admin/evaluator/loadrun/add/",
        {"workspace": globex_pk, "manifest": "load-manifest.v2.json", "target": "evaluator"},
    )
    assert "workspace" in load.context["form"].errors
    assert not ProfileVersion.objects.filter(proposed_by=ann).exists()
    assert not EvaluationRun.objects.filter(submitted_by=ann).exists()
    assert not LoadRun.objects.filter(submitted_by=ann).exists()


def test_admin_offers_each_action_only_where_its_role_allows(make_user, workspace, approved):
    version = approved("v1")
    vera = make_user("vera", permissions=("approve_profileversion", "activate_profileversion"))
    workspace.members.add(vera, through_defaults={"role": "approver"})
    client = _admin(vera)
    choices = client.get("/admin/admission/profileversion/").context["action_form"]
    offered = [name for name, _ in choices.fields["action"].choices if name]
    # An approver may propose, so may ask for a what-if of a proposal; not activate.
    assert offered == ["approve_selected", "reject_selected", "run_what_if"]
    _act(client, "profileversion", "activate_selected", version)
    assert not ProfileChangeRecord.objects.exists()


def test_an_approver_of_b_cannot_act_on_b_from_a_role_in_a(ann, globex, make_user):
    # ann may approve in acme and only view globex: the action is offered (acme), the row
    # is listed (globex), and the service still refuses it, reporting why.
    globex["workspace"].members.add(ann, through_defaults={"role": "viewer"})
    response = _act(_admin(ann), "profileversion", "approve_selected", globex["pending"], **CHECKS)
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [
        "Refused: globex:globex-v3: you may not approve or reject changes in workspace globex"
    ]
    assert not ProfileApproval.objects.filter(version=globex["pending"]).exists()


def test_workspaces_and_roles_are_managed_by_superusers_only(ann, django_user_model, workspace):
    assert _admin(ann).get("/admin/admission/workspace/").status_code == 403
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    page = _admin(root).get(f"/admin/admission/workspace/{workspace.pk}/change/")
    assert page.status_code == 200
    assert "memberships-TOTAL_FORMS" in page.content.decode()


# ----------------------------------------------------------------------------------- API


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _post_profile_and_load_run(client: APIClient, document: Any) -> tuple[Any, Any]:
    profile = client.post("/api/workspaces/globex/profiles/", {"document": document}, format="json")
    load = client.post(
        "/api/workspaces/globex/load-runs/",
        {"manifest": "load-manifest.v2.json", "target": "evaluator"},
        format="json",
    )
    return profile, load


def test_api_refuses_posting_another_workspaces_profiles_and_load_runs(ann, globex, make_document):
    client = _api(ann)
    profile, load = _post_profile_and_load_run(client, make_document("sneak"))
    evaluation = client.post(
        "/api/workspaces/globex/evaluations/", example_request(1), format="json"
    )
    for response in (profile, load, evaluation):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found"
        assert b"Globex" not in response.content
    assert not ProfileVersion.objects.filter(profile_version="sneak").exists()
    assert LoadRun.objects.filter(submitted_by=ann).count() == 0


def test_api_viewers_read_but_may_not_write(ann, globex, make_document):
    globex["workspace"].members.add(ann, through_defaults={"role": "viewer"})
    client = _api(ann)
    assert client.get("/api/workspaces/globex/profiles/").status_code == 200
    assert client.get("/api/workspaces/globex/load-runs/").status_code == 200
    profile, load = _post_profile_and_load_run(client, make_document("sneak"))
    assert profile.status_code == load.status_code == 403
    assert profile.json()["error"]["detail"] == (
        "you may not propose profile versions in workspace globex"
    )
    assert load.json()["error"]["detail"] == "you may not start load runs in workspace globex"


# ------------------------------------------------------------------ manage.py profiles


ACTIVATE_V1_AS_ALEX = ("activate", "--workspace", "acme", "--version", "v1", "--user", "alex")


def _profiles(*args: str, **environment: str) -> str:
    out = io.StringIO()
    cleared = {"SLUICE_PROFILES_TOKEN": "", "SLUICE_PROFILES_PASSWORD": "", **environment}
    with mock.patch.dict(os.environ, cleared):
        call_command("profiles", *args, stdout=out)
    return out.getvalue()


def test_shell_refuses_a_user_who_proved_nothing(workspace, approved, proposer):
    version = approved("v1")
    args = ACTIVATE_V1_AS_ALEX
    with pytest.raises(CommandError, match="prove who alex is"):
        _profiles(*args)
    with pytest.raises(CommandError, match="could not verify that you are alex"):
        _profiles(*args, SLUICE_PROFILES_PASSWORD="wrong-password")
    # pat's own token does not make pat alex.
    _, pats_token = AuthToken.objects.create(user=proposer)
    with pytest.raises(CommandError, match="could not verify that you are alex"):
        _profiles(*args, SLUICE_PROFILES_TOKEN=pats_token)
    assert not ProfileChangeRecord.objects.filter(version=version).exists()


def test_shell_acts_with_the_users_token(workspace, approved, approver):
    approved("v1")
    _, token = AuthToken.objects.create(user=approver)
    out = _profiles(*ACTIVATE_V1_AS_ALEX, SLUICE_PROFILES_TOKEN=token)
    assert "Activated v1 in acme" in out
    assert ProfileChangeRecord.objects.get().actor == approver


def test_shell_applies_the_same_roles_as_the_api(globex, make_user, make_document, tmp_path):
    outsider = make_user("otto")
    path = tmp_path / "doc.json"
    path.write_text(__import__("json").dumps(make_document("otto-v1")))
    password = {"SLUICE_PROFILES_PASSWORD": "otto-password"}
    ws = ("--workspace", "globex", "--user", "otto")
    with pytest.raises(CommandError, match="you may not propose profile versions in"):
        _profiles("propose", *ws, "--file", str(path), **password)
    with pytest.raises(CommandError, match="you may not activate"):
        _profiles("activate", *ws, "--version", "globex-v1", **password)
    with pytest.raises(CommandError, match="you may not approve"):
        _profiles("rollback", "approve", *ws, **password)
    with pytest.raises(CommandError, match="you may not see workspace globex"):
        _profiles("history", *ws, **password)
    globex["rollback"].refresh_from_db()
    assert globex["rollback"].status == RollbackRequest.Status.PENDING
    assert not ProfileVersion.objects.filter(proposed_by=outsider).exists()


def test_shell_four_eyes_needs_two_people_even_for_an_operator(
    workspace, proposer, tmp_path, make_document
):
    path = tmp_path / "doc.json"
    path.write_text(__import__("json").dumps(make_document("v1")))
    pat = {"SLUICE_PROFILES_PASSWORD": "pat-password"}
    ws = ("--workspace", "acme", "--user", "pat")
    _profiles("propose", *ws, "--file", str(path), **pat)
    with pytest.raises(CommandError, match="second person"):
        _profiles("approve", *ws, "--version", "v1", "--confirm-all", **pat)
    assert not ProfileApproval.objects.exists()
