"""REST API: who sees what, proposing, history pagination and filters, the OpenAPI schema."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.core.management import call_command
from knox.models import AuthToken
from rest_framework.test import APIClient

from admission.models import ProfileVersion
from admission.services import profiles as services

pytestmark = pytest.mark.django_db


def _client(user: Any = None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def _history(client: APIClient, key: str = "acme", **params: Any) -> Any:
    return client.get(f"/api/workspaces/{key}/profile-history/", params)


def _walk_pages(client: APIClient, url: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    response = client.get(url, params)
    while True:
        assert response.status_code == 200, response.content
        rows.extend(response.data["results"])
        if not response.data["next"]:
            return rows
        response = client.get(response.data["next"])


# ---------------------------------------------------------------- permissions


@pytest.mark.parametrize(
    "url",
    [
        "/api/workspaces/",
        "/api/workspaces/acme/",
        "/api/workspaces/acme/profile-history/",
        "/api/workspaces/acme/profiles/",
        "/api/workspaces/acme/profiles/v1/",
    ],
)
def test_anonymous_callers_are_refused(workspace, url):
    response = _client().get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.data["error"]["type"] == "not_authenticated"


@pytest.mark.parametrize(
    "url",
    [
        "/api/workspaces/globex/",
        "/api/workspaces/globex/profile-history/",
        "/api/workspaces/globex/profiles/",
        "/api/workspaces/globex/profiles/v1/",
        "/api/workspaces/no-such-workspace/profile-history/",
    ],
)
def test_non_members_get_404_without_the_workspace_name(workspace, other_workspace, member, url):
    response = _client(member).get(url)
    assert response.status_code == 404
    assert b"Globex" not in response.content
    assert response.data["error"]["type"] == "not_found"


def test_non_member_post_is_404_not_403(other_workspace, outsider, make_document):
    response = _client(outsider).post(
        "/api/workspaces/globex/profiles/", {"document": make_document("v1")}, format="json"
    )
    assert response.status_code == 404


def test_members_see_their_workspaces_only(workspace, other_workspace, member, approver, approved):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    response = _client(member).get("/api/workspaces/")
    assert response.status_code == 200
    assert response.data == [
        {
            "key": "acme",
            "name": "Acme Corp",
            "currentProfileVersion": "v1",
            "createdAt": response.data[0]["createdAt"],
        }
    ]
    assert _history(_client(member)).status_code == 200


def test_staff_status_and_global_permissions_grant_no_workspace(
    workspace, other_workspace, make_user, seed_history, django_user_model
):
    seed_history(other_workspace, 3)
    auditor = make_user(
        "auditor", permissions=("view_workspace", "view_profilechangerecord", "view_profileversion")
    )
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    for user in (auditor, root):
        client = _client(user)
        assert client.get("/api/workspaces/").data == []
        assert _history(client, "globex").status_code == 404
        assert client.get("/api/workspaces/globex/profiles/").status_code == 404


def test_staff_without_the_permission_see_only_memberships(
    workspace, other_workspace, make_user, member
):
    staff = make_user("staffer")
    workspace.members.add(staff)
    assert [w["key"] for w in _client(staff).get("/api/workspaces/").data] == ["acme"]


def test_token_authentication(workspace, proposer):
    _, token = AuthToken.objects.create(user=proposer)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/workspaces/acme/profiles/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    refused = client.get("/api/workspaces/acme/profiles/")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == "Token"
    assert refused.data["error"]["type"] == "authentication_failed"


def test_session_authentication(client, workspace, member):
    client.force_login(member)
    assert client.get("/api/workspaces/acme/profile-history/").status_code == 200


# ---------------------------------------------------------------- profiles


def test_propose_creates_a_version(workspace, member, make_document):
    response = _client(member).post(
        "/api/workspaces/acme/profiles/", {"document": make_document("v1")}, format="json"
    )
    assert response.status_code == 201, response.content
    stored = ProfileVersion.objects.get()
    assert response.data["profileVersion"] == "v1"
    assert response.data["profileDigest"] == stored.profile_digest
    assert response.data["proposedBy"] == "mia"
    assert response.data["status"] == "proposed"
    assert response.data["approvals"] == []


def test_propose_invalid_profile_is_400_naming_the_field(workspace, member, make_document):
    document = make_document("v1")
    document["providers"]["jev"]["concurrency"] = -1
    response = _client(member).post(
        "/api/workspaces/acme/profiles/", {"document": document}, format="json"
    )
    assert response.status_code == 400
    assert response.data["error"]["type"] == "invalid"
    (message,) = response.data["error"]["fields"]["document"]
    assert message.startswith("providers.jev.concurrency: ")
    assert not ProfileVersion.objects.exists()


def test_propose_lists_every_problem_of_the_document(workspace, member, make_document):
    document = make_document("v1")
    document["workspace"]["concurrency"] = 0
    document["providers"]["jev"]["maxQueueLength"] = "many"
    document["bogus"] = 1
    response = _client(member).post(
        "/api/workspaces/acme/profiles/", {"document": document}, format="json"
    )
    assert response.status_code == 400
    assert response.data["error"]["fields"]["document"] == [
        "bogus: unknown key",
        "workspace.concurrency: must be at least 1, got 0",
        "providers.jev.maxQueueLength: must be an integer, got a string",
    ]
    assert not ProfileVersion.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "document"), ({"document": [1, 2]}, "document"), ({"document": "{}"}, "document")],
)
def test_propose_malformed_body_is_400(workspace, member, body, field):
    response = _client(member).post("/api/workspaces/acme/profiles/", body, format="json")
    assert response.status_code == 400
    assert field in response.data["error"]["fields"]


def test_propose_unparseable_json_is_400(workspace, member):
    response = _client(member).post(
        "/api/workspaces/acme/profiles/", "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert response.data["error"]["type"] == "parse_error"


def test_propose_same_document_again_returns_the_existing_version(workspace, member, make_document):
    client = _client(member)
    url = "/api/workspaces/acme/profiles/"
    assert client.post(url, {"document": make_document("v1")}, format="json").status_code == 201
    again = client.post(url, {"document": make_document("v1")}, format="json")
    assert again.status_code == 200
    assert again.data["profileVersion"] == "v1"
    assert ProfileVersion.objects.count() == 1


def test_propose_label_with_other_limits_is_400(workspace, member, make_document):
    client = _client(member)
    url = "/api/workspaces/acme/profiles/"
    client.post(url, {"document": make_document("v1")}, format="json")
    response = client.post(url, {"document": make_document("v1", concurrency=2)}, format="json")
    assert response.status_code == 400
    assert "other limits" in response.data["error"]["fields"]["document"][0]


def test_propose_needs_a_role_that_may_propose(workspace, make_user, make_document, member):
    viewer = make_user("viewer", permissions=("add_profileversion", "view_profileversion"))
    workspace.members.add(viewer, through_defaults={"role": "member"})
    response = _client(viewer).post(
        "/api/workspaces/acme/profiles/", {"document": make_document("v1")}, format="json"
    )
    assert response.status_code == 403
    assert response.data["error"] == {
        "type": "permission_denied",
        "detail": "you may not propose profile versions in workspace acme",
    }
    assert _client(viewer).get("/api/workspaces/acme/profiles/").status_code == 200


def test_versions_list_and_detail_show_approvals_and_digests(
    workspace, proposer, approver, approved, make_document, member
):
    v1 = approved("v1")
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_propose(
        workspace=workspace, document=make_document("v2", concurrency=2), proposed_by=proposer
    )
    client = _client(member)
    listing = client.get("/api/workspaces/acme/profiles/").data["results"]
    assert [(v["profileVersion"], v["status"]) for v in listing] == [
        ("v2", "proposed"),
        ("v1", "active"),
    ]
    detail = client.get("/api/workspaces/acme/profiles/v1/").data
    assert detail["digest"] == v1.digest
    assert detail["profileDigest"] == v1.profile_digest
    assert detail["document"]["profileVersion"] == "v1"
    (approval,) = detail["approvals"]
    assert approval["approver"] == "alex"
    assert approval["decision"] == "approve"
    assert approval["runbook"] == "RUN-JEV-ADMISSION-v1"
    assert all(approval["checklist"].values())
    assert client.get("/api/workspaces/acme/profiles/nope/").status_code == 404


# ---------------------------------------------------------------- history


def test_CNC_ADMIT_AUDIT_history_serves_the_core_records(
    workspace, proposer, approver, approved, member
):
    from admission.runtime import registry as runtime

    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    request = services.rollback_request_create(
        workspace=workspace, target=v1, requested_by=proposer
    )
    services.rollback_request_approve(request=request, approver=approver)

    results = _history(_client(member)).data["results"]

    core = [r.to_dict() for r in runtime.get_registry().profile_history("acme")]
    record_keys = list(core[0])
    assert [{key: row[key] for key in record_keys} for row in reversed(results)] == core
    assert results[0]["kind"] == "rollback"
    assert results[0]["rollbackRequest"]["requestedBy"] == "pat"
    assert results[0]["approval"]["approver"] == "alex"


def test_history_records_render_exactly_as_the_declared_fields_do(
    workspace, proposer, approver, approved
):
    from rest_framework import serializers as drf

    from admission.models import ProfileChangeRecord
    from console.api.admission.serializers import ProfileChangeRecordSerializer

    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    request = services.rollback_request_create(
        workspace=workspace, target=v1, requested_by=proposer, reason="too tight"
    )
    services.rollback_request_approve(request=request, approver=approver, comment="ok")
    records = list(ProfileChangeRecord.objects.filter(workspace=workspace))
    assert {record.kind for record in records} == {"initial", "change", "rollback"}
    serializer = ProfileChangeRecordSerializer()
    for record in records:
        generic = drf.ModelSerializer.to_representation(serializer, record)
        assert json.loads(json.dumps(serializer.to_representation(record))) == json.loads(
            json.dumps(generic)
        )
        assert list(serializer.to_representation(record)) == list(generic)


def test_history_cursor_pages_cover_every_record_once(workspace, member, seed_history):
    records = seed_history(workspace, 23)
    rows = _walk_pages(_client(member), "/api/workspaces/acme/profile-history/", {"page_size": 5})
    assert len(rows) == 23
    assert len({row["id"] for row in rows}) == 23
    expected = sorted(records, key=lambda r: (r.at, r.id), reverse=True)
    assert [row["id"] for row in rows] == [r.id for r in expected]


def test_history_filters_by_kind_and_time_range(workspace, member, seed_history):
    seed_history(workspace, 20)
    client = _client(member)
    url = "/api/workspaces/acme/profile-history/"
    rollbacks = _walk_pages(client, url, {"kind": "rollback"})
    assert {row["kind"] for row in rollbacks} == {"rollback"}
    assert len(rollbacks) == 4
    both = _walk_pages(client, url, {"kind": ["change", "rollback"]})
    assert {row["kind"] for row in both} == {"change", "rollback"}
    assert len(both) == 19
    window = _walk_pages(
        client,
        url,
        {"at_after": "2025-01-01T00:05:00Z", "at_before": "2025-01-01T00:09:00Z", "page_size": 2},
    )
    times = [dt.datetime.fromisoformat(row["at"].replace("Z", "+00:00")) for row in window]
    assert times and all(
        dt.datetime(2025, 1, 1, 0, 5, tzinfo=dt.UTC)
        <= at
        <= dt.datetime(2025, 1, 1, 0, 9, tzinfo=dt.UTC)
        for at in times
    )
    assert len(window) == 4


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"kind": "sideways"}, "kind"),
        ({"kind": ["change", "sideways"]}, "kind"),
        ({"at_after": "yesterday"}, "at_after"),
        ({"at_before": "2025-13-01T00:00:00Z"}, "at_before"),
    ],
)
def test_history_bad_filters_are_400_naming_the_field(workspace, member, params, field):
    response = _history(_client(member), **params)
    assert response.status_code == 400
    assert set(response.data["error"]["fields"]) == {field}


def test_history_bad_cursor_is_404_not_500(workspace, member):
    response = _history(_client(member), cursor="garbage")
    assert response.status_code == 404


@pytest.mark.parametrize("page_size", [5, 100])
def test_history_query_count_does_not_grow_with_page_size(
    workspace, member, seed_history, django_assert_max_num_queries, page_size
):
    seed_history(workspace, 120)
    client = _client(member)
    # One for the workspace, one for the caller's role in it, one for the page; none per row.
    with django_assert_max_num_queries(3):
        response = _history(client, page_size=page_size)
    assert len(response.data["results"]) == page_size


# ---------------------------------------------------------------- schema


def test_openapi_schema_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    schema = target.read_text()
    assert "/api/workspaces/{workspace_key}/profile-history/" in schema
    assert "/api/workspaces/{workspace_key}/profiles/{profile_version}/" in schema


def test_openapi_advertises_only_request_bodies_that_work(client, workspace, member):
    schema = client.get("/api/schema/?format=json").json()
    bodies = {
        path: set(operation["post"]["requestBody"]["content"])
        for path, operation in schema["paths"].items()
        if "post" in operation and "requestBody" in operation["post"]
    }
    # Every document is nested JSON, parsed by the one bounded JSON parser: only JSON is
    # advertised, and a form body is a typed 415.
    assert all(media == {"application/json"} for media in bodies.values()), bodies
    assert {
        "/api/workspaces/{workspace_key}/evaluations/",
        "/api/workspaces/{workspace_key}/profiles/",
        "/api/workspaces/{workspace_key}/load-runs/",
        "/api/workspaces/{workspace_key}/profiles/{profile_version}/approve/",
        "/api/workspaces/{workspace_key}/scheduling/",
    } <= set(bodies)
    # The token endpoint takes no body: HTTP Basic proves who asks.
    assert "requestBody" not in schema["paths"]["/api/auth/token/"]["post"]
    client.force_login(member)
    for url in ("/api/workspaces/acme/evaluations/", "/api/workspaces/acme/profiles/"):
        refused = client.post(url, {"document": "{}"})
        assert refused.status_code == 415
        assert refused.json()["error"]["type"] == "unsupported_media_type"


def test_docs_ui_is_served_without_a_cdn(client, member):
    client.force_login(member)
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "drf_spectacular_sidecar" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html


@pytest.mark.parametrize(
    "url",
    ["/api/workspaces/", "/api/workspaces/acme/profiles/", "/api/workspaces/acme/profile-history/"],
)
def test_browsable_api_pages_render(workspace, member, url):
    response = _client(member).get(url, HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert b"<html" in response.content
