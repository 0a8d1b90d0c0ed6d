"""Who may submit and read runs: members for evaluations, operators for load runs."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, LoadRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def workspace():
    return Workspace.objects.create(key="acme", name="Acme")


def _client(django_user_model, username, *, staff=False, perms=(), member_of=None, role="member"):
    user = django_user_model.objects.create_user(username=username, is_staff=staff)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="evaluator", codename__in=perms)
    )
    if member_of is not None:
        member_of.members.add(user, through_defaults={"role": role})
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_non_member_does_not_see_the_workspace(django_user_model, workspace):
    client = _client(django_user_model, "olga", staff=True, perms=("view_evaluationrun",))
    response = client.get("/api/workspaces/acme/evaluations/")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"
    posted = client.post("/api/workspaces/acme/evaluations/", example_request(1), format="json")
    assert posted.status_code == 404
    assert EvaluationRun.objects.count() == 0


def test_a_member_needs_an_active_profile_to_submit(django_user_model, workspace):
    client = _client(django_user_model, "mia", member_of=workspace)
    response = client.post("/api/workspaces/acme/evaluations/", example_request(1), format="json")
    assert response.status_code == 400
    assert "scheduler.profile" in response.json()["error"]["fields"]
    assert EvaluationRun.objects.count() == 0


def test_anonymous_callers_are_refused(workspace):
    response = APIClient().get("/api/workspaces/acme/evaluations/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize(
    ("staff", "perms", "role"),
    [
        (True, ("add_loadrun", "view_loadrun"), "approver"),
        (False, ("add_loadrun",), "member"),
        (True, (), "viewer"),
    ],
)
def test_load_runs_need_the_operator_role(django_user_model, workspace, staff, perms, role):
    client = _client(
        django_user_model, "sam", staff=staff, perms=perms, member_of=workspace, role=role
    )
    body = {"manifest": "load-manifest.v2.json", "target": "admission-controller"}
    response = client.post("/api/workspaces/acme/load-runs/", body, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_denied"
    assert LoadRun.objects.count() == 0
