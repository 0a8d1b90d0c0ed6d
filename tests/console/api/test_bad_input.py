"""Finding 5: bad input is a typed 4xx, never a 500 — deep JSON, NUL and lone surrogates, numbers
JSON cannot hold, tampered cursors, impossible labels — through the API and the admin forms."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from admission.models import ProfileVersion
from admission.services import profiles as services
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, LoadRun

pytestmark = pytest.mark.django_db

WRITE_ENDPOINTS = (
    "/api/workspaces/acme/profiles/",
    "/api/workspaces/acme/evaluations/",
    "/api/workspaces/acme/load-runs/",
)
DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture
def operator_api(proposer: Any, workspace: Any) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(proposer)
    return client


def _post(client: APIClient, url: str, body: str) -> Any:
    return client.post(url, body, content_type="application/json")


def _nothing_written() -> bool:
    return not (
        ProfileVersion.objects.exists()
        or EvaluationRun.objects.exists()
        or LoadRun.objects.exists()
    )


@pytest.mark.parametrize("url", WRITE_ENDPOINTS)
def test_deeply_nested_json_is_a_parse_error(operator_api, url):
    for body in (DEEP, '{"document": ' + DEEP + "}", '{"input": {"x": ' + DEEP + "}}"):
        response = _post(operator_api, url, body)
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["type"] == "parse_error"
        assert "nested deeper than 64 levels" in error["detail"]
    assert _nothing_written()


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ('{"input": {"text": "a\\u0000b"}}', "input.text", "NUL"),
        ('{"input": {"text": "\\ud800"}}', "input.text", "lone surrogate"),
        ('{"input": {"\\u0000key": 1}}', "input.\\u0000key", "NUL"),
        ('{"deadlineMs": NaN}', "deadlineMs", "finite"),
        ('{"deadlineMs": Infinity}', "deadlineMs", "finite"),
        (
            '{"ruleset": {"decisions": [{"outputSchema": {"enum": [1e400]}}]}}',
            "ruleset.decisions[0].outputSchema.enum[0]",
            "finite",
        ),
    ],
)
def test_unstorable_values_in_evaluations_are_400_naming_the_field(
    operator_api, body, field, problem
):
    response = _post(operator_api, "/api/workspaces/acme/evaluations/", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid"
    (message,) = error["fields"][field]
    assert problem in message
    assert _nothing_written()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(profileVersion="demo-v1\u200b"), "U+200B"),
        (lambda d: d.update(profileVersion="v1\u202egnp.exe"), "U+202E"),
        (lambda d: d.update(profileVersion="   "), "whitespace"),
        (lambda d: d.update(profileVersion="v1 "), "whitespace"),
        (lambda d: d.update(profileVersion="v" * 129), "at most 128"),
        (
            lambda d: d["principals"].__setitem__(0, {**d["principals"][0], "id": "p\u200d"}),
            "U+200D",
        ),
        (lambda d: d["principals"].__setitem__(0, {**d["principals"][0], "id": "p" * 300}), "128"),
    ],
)
def test_labels_and_principal_ids_must_be_printable_and_bounded(
    operator_api, make_document, mutate, field
):
    document = make_document("v1")
    mutate(document)
    response = operator_api.post(
        "/api/workspaces/acme/profiles/", {"document": document}, format="json"
    )
    assert response.status_code == 400, response.content
    (message,) = response.json()["error"]["fields"]["document"]
    assert field in message
    assert _nothing_written()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"document": {"profileVersion": "v\\u0000"}}', "document.profileVersion"),
        ('{"document": {"principals": {"\\udfff": {}}}}', "document.principals.\\udfff"),
    ],
)
def test_nul_and_surrogates_in_profile_labels_and_principal_ids_are_400(operator_api, body, field):
    response = _post(operator_api, "/api/workspaces/acme/profiles/", body)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert _nothing_written()


def _cursor(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


PAGINATED = (
    "/api/workspaces/acme/profile-history/",
    "/api/workspaces/acme/profiles/",
    "/api/workspaces/acme/evaluations/",
    "/api/workspaces/acme/load-runs/",
)


@pytest.mark.parametrize("url", PAGINATED)
@pytest.mark.parametrize(
    "cursor",
    [
        _cursor("p=not-a-date"),
        _cursor("p=2025-13-45T99:00:00"),
        _cursor("p=%00"),
        _cursor("o=-1&p=x"),
        "garbage",
        "ü-not-ascii",
    ],
)
def test_tampered_cursors_are_404_on_every_list(operator_api, approved, approver, url, cursor):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    response = operator_api.get(url, {"cursor": cursor})
    assert response.status_code == 404, response.content
    assert response.json() == {"error": {"type": "not_found", "detail": "Invalid cursor"}}


@pytest.mark.parametrize("label", ["%00", "%E2%80%8B", "x" * 200, "%20"])
def test_impossible_labels_in_the_url_are_404(operator_api, label):
    response = operator_api.get(f"/api/workspaces/acme/profiles/{label}/")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("/admin/admission/profileversion/add/", "document"),
        ("/admin/evaluator/evaluationrun/add/", "document"),
    ],
)
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (DEEP, "nested deeper than 64 levels"),
        ('{"input": {"text": "\\u0000"}}', "NUL"),
        ('{"input": {"text": "\\udc80"}}', "lone surrogate"),
        ('{"profileVersion": 1e400}', "finite"),
    ],
)
def test_admin_json_forms_refuse_the_same_input_on_the_field(
    proposer, workspace, url, form, text, problem
):
    client = Client(raise_request_exception=False)
    client.force_login(proposer)
    response = client.post(url, {"workspace": workspace.pk, "document": text})
    assert response.status_code == 200
    assert problem in " ".join(response.context["form"].errors[form])
    assert _nothing_written()


def test_a_valid_evaluation_still_goes_through_the_bounded_parser(
    operator_api, approved, approver, settings
):
    settings.SLUICE_ADAPTERS = {"jev": {"kind": "fake"}}
    services.profile_version_activate(version=approved("v1"), actor=approver)
    document = example_request(1, adapter="jev")
    document["input"] = {"text": "nested " * 10, "deep": [[[[{"ok": 1.5}]]]]}
    response = _post(operator_api, "/api/workspaces/acme/evaluations/", json.dumps(document))
    assert response.status_code == 201, response.content
    assert EvaluationRun.objects.get().document["input"]["deep"] == [[[[{"ok": 1.5}]]]]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"at_after": "4487-03-11T07:44:12.340294-17:24"}, 200),
        ({"at_before": "2025-01-01T00:00:00+23:59"}, 200),
        ({"at_after": "9999-12-31T23:59:59-23:00"}, 400),
        ({"at_before": "0001-01-01T00:00:00+01:00"}, 400),
    ],
)
def test_time_bounds_with_offsets_postgresql_cannot_hold_are_answered(operator_api, params, status):
    # Found by the schemathesis run: an offset beyond ±15:59 used to reach the database.
    response = operator_api.get("/api/workspaces/acme/profile-history/", params)
    assert response.status_code == status, response.content
    if status == 400:
        assert list(response.json()["error"]["fields"]) == list(params)
