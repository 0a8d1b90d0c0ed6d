"""What-if over REST: a proposer starts a what-if run of a proposed version, a viewer reads its
record and verdict, a member of another workspace finds nothing; every answer conforms to the
OpenAPI schema (checked by schemathesis against the served schema)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core import signals
from django.db import close_old_connections
from knox.models import AuthToken
from schemathesis.checks import response_schema_conformance

from admission.models import Workspace
from admission.services import profiles
from config.demo import demo_profile
from config.wsgi import application
from evaluator.models import LoadRun
from evaluator.worker import load_dispatch

pytestmark = pytest.mark.django_db

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
WHAT_IF = "/api/workspaces/{workspace_key}/profiles/{profile_version}/what-if/"
LOAD_RUN = "/api/workspaces/{workspace_key}/load-runs/{run_id}/"


@pytest.fixture
def demo(demo: Workspace) -> Iterator[Workspace]:
    # Straight through WSGI Django would close the test's connection after each request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield demo
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _token(name: str, workspace: Workspace, role: str) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=name)
    workspace.members.add(user, through_defaults={"role": role})
    return user, str(AuthToken.objects.create(user=user)[1])


def _call(path: str, method: str, token: str, body: Any = None, **params: str) -> Any:
    operation = schema[path][method]
    if body is None:
        case = operation.Case(path_parameters=params)
    else:
        case = operation.Case(path_parameters=params, body=body)
    response = case.call(headers={"Authorization": f"Token {token}"})
    case.validate_response(response, checks=[response_schema_conformance])
    return response


def test_a_proposer_starts_a_what_if_a_viewer_reads_its_verdict_a_stranger_sees_nothing(demo):
    proposer, proposer_token = _token("pia", demo, "proposer")
    _, viewer_token = _token("vic", demo, "viewer")
    _, member_token = _token("mo", demo, "member")
    _, stranger_token = _token("sam", Workspace.objects.create(key="other", name="O"), "operator")
    tight = demo_profile("demo-v2", concurrency=1, maxQueueLength=1)
    profiles.profile_version_propose(workspace=demo, document=tight, proposed_by=proposer)
    where = {"workspace_key": "demo", "profile_version": "demo-v2"}

    started = _call(WHAT_IF, "POST", proposer_token, {"target": "admission-controller"}, **where)
    assert started.status_code == 201, started.text
    run = started.json()
    assert (run["status"], run["whatIfVersion"], run["verdict"]) == ("queued", "demo-v2", None)
    assert (run["manifest"], run["submittedBy"]) == ("load-manifest.v2.json", "pia")

    done = load_dispatch.load_run_execute(run["id"])
    assert done is not None and done.status == "completed"

    listed = _call(WHAT_IF, "GET", viewer_token, **where)
    assert listed.status_code == 200
    (shown,) = listed.json()["results"]
    assert shown["id"] == run["id"]
    read = _call(LOAD_RUN, "GET", viewer_token, workspace_key="demo", run_id=run["id"])
    assert read.status_code == 200
    record, verdict = read.json()["record"], read.json()["verdict"]
    assert record["mode"] == "what-if"
    assert record["whatIf"]["profileVersion"] == "demo-v2"
    assert verdict["passed"] is record["passed"]
    assert [b["bound"] for b in verdict["bounds"]] == [c["bound"] for c in record["comparisons"]]
    assert verdict["failed"] == [c["bound"] for c in record["comparisons"] if not c["pass"]]
    assert shown["verdict"] == verdict

    # Roles as in the admin: a member may not start one; a viewer may not either.
    for token in (member_token, viewer_token):
        refused = _call(WHAT_IF, "POST", token, {}, **where)
        assert refused.status_code == 403
    # Another workspace's member finds neither the version, its runs nor the run.
    assert _call(WHAT_IF, "GET", stranger_token, **where).status_code == 404
    assert _call(WHAT_IF, "POST", stranger_token, {}, **where).status_code == 404
    stranger_read = _call(LOAD_RUN, "GET", stranger_token, workspace_key="demo", run_id=run["id"])
    assert stranger_read.status_code == 404
    assert LoadRun.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"target": "staged-provider"}, "target"),
        ({"target": "nope"}, "target"),
        ({"manifest": "load-manifest.v1.json"}, "target"),
        ({"manifest": "other.json"}, "manifest"),
        ({"mapping": {"principals": {"noisy": "nobody"}}}, "mapping.principals"),
        ({"mapping": ["noisy"]}, "mapping"),
    ],
)
def test_bad_what_if_requests_are_typed_400s_naming_the_field(demo, body, field):
    proposer, token = _token("pia", demo, "proposer")
    profiles.profile_version_propose(
        workspace=demo, document=demo_profile("demo-v2"), proposed_by=proposer
    )
    where = {"workspace_key": "demo", "profile_version": "demo-v2"}
    refused = _call(WHAT_IF, "POST", token, body, **where)
    assert refused.status_code == 400, refused.text
    fields = refused.json()["error"]["fields"]
    assert any(name.startswith(field) for name in fields), fields
    assert not LoadRun.objects.exists()
    missing = _call(
        WHAT_IF, "POST", token, {}, workspace_key="demo", profile_version="no-such-version"
    )
    assert missing.status_code == 404
