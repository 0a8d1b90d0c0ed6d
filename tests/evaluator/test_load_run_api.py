"""Load runs through the REST API and the admin in this process (no worker: a submitted load
run stays `queued` here; the worker's side is in tests/service/test_load_runs.py): queued
through the database, progress and cancel fields, the cancel route and action, roles."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from admission.models import Workspace
from evaluator.models import LoadRun
from evaluator.worker import load_dispatch

pytestmark = pytest.mark.django_db

RUNS = "/api/workspaces/demo/load-runs/"
BODY = {"manifest": "load-manifest.v2.json", "target": "admission-controller"}


def _user(name: str, workspace: Workspace | None, role: str) -> Any:
    user = get_user_model().objects.create_user(username=name, is_staff=True)
    if workspace is not None:
        workspace.members.add(user, through_defaults={"role": role})
    return user


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_load_run_is_queued_in_the_database_and_cancelled_over_the_api(demo):
    operator = _user("olga", demo, "operator")
    client = _client(operator)
    response = client.post(RUNS, BODY, format="json")
    assert response.status_code == 201, response.content
    run = response.json()
    assert (run["status"], run["progress"], run["cancelRequestedAt"]) == ("queued", None, None)

    cancelled = client.post(f"{RUNS}{run['id']}/cancel/")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["cancelRequestedBy"] == "olga"
    again = client.post(f"{RUNS}{run['id']}/cancel/")
    assert again.status_code == 409
    assert again.json()["error"]["type"] == "run-finished"

    # A running one: the request is recorded, its claimant ends it.
    second = client.post(RUNS, BODY, format="json").json()
    (claimed,) = load_dispatch.load_runs_claim("w1", 1)
    assert str(claimed.pk) == second["id"]
    LoadRun.objects.filter(pk=claimed.pk).update(progress=0.25)
    shown = client.get(f"{RUNS}{second['id']}/").json()
    assert (shown["status"], shown["progress"]) == ("running", 0.25)
    asked = client.post(f"{RUNS}{second['id']}/cancel/")
    assert asked.status_code == 202
    assert asked.json()["status"] == "running"
    assert asked.json()["cancelRequestedAt"] is not None


def test_only_operators_cancel_and_other_workspaces_do_not_exist(demo):
    operator = _user("olga", demo, "operator")
    run = _client(operator).post(RUNS, BODY, format="json").json()
    member = _user("mia", demo, "member")
    refused = _client(member).post(f"{RUNS}{run['id']}/cancel/")
    assert refused.status_code == 403
    stranger = _user("sam", Workspace.objects.create(key="other", name="Other"), "operator")
    assert _client(stranger).post(f"{RUNS}{run['id']}/cancel/").status_code == 404
    assert LoadRun.objects.get().status == "queued"


def test_the_backlog_cap_is_a_typed_429(demo, settings):
    settings.SLUICE_WORKSPACE_LOAD_RUNS_QUEUED = 1
    client = _client(_user("olga", demo, "operator"))
    assert client.post(RUNS, BODY, format="json").status_code == 201
    refused = client.post(RUNS, BODY, format="json")
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "throttled"
    assert LoadRun.objects.count() == 1


def test_the_admin_cancels_selected_load_runs(demo):
    operator = _user("olga", demo, "operator")
    run = _client(operator).post(RUNS, BODY, format="json").json()
    browser = Client()
    browser.force_login(operator)
    page = browser.get(f"/admin/evaluator/loadrun/{run['id']}/change/")
    assert page.status_code == 200
    assert b'value="cancel_load_runs"' in page.content
    response = browser.post(
        "/admin/evaluator/loadrun/",
        {"action": "cancel_load_runs", "_selected_action": [run["id"]], "index": 0},
        follow=True,
    )
    assert response.status_code == 200
    assert LoadRun.objects.get().status == "cancelled"
    assert b"Cancelled" in response.content
