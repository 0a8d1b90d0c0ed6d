"""One translation of a service's refusal (`admission.core.ServiceError`) per interface: the
API's exception handler, the admin's form and message adapter, the commands' `CommandError`."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms

from admission.core import InvalidProfileError, ServiceError
from admission.services.profile_problems import InvalidProfileDocument
from admission.services.profiles import ProfileServiceError
from console.admin.kit import form_refusal, refusal_text
from console.api.errors import exception_handler
from console.management.refusals import command_error
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.services.cancellation import RunAlreadyFinished
from evaluator.services.errors import InvalidRunRequest, LoadRunBacklogFull
from evaluator.services.usage import UsageRangeError

TWO_PROBLEMS = InvalidProfileDocument(
    [
        InvalidProfileError("workspace.concurrency", "must be a positive integer"),
        InvalidProfileError("providers.jev", "unknown key"),
    ]
)


def _answer(error: Exception, view: Any = None) -> tuple[int, Any]:
    response = exception_handler(error, {"view": view})
    assert response is not None
    return response.status_code, response.data


@pytest.mark.parametrize(
    "code,status",
    [
        ("four_eyes", 403),
        ("permission_denied", 403),
        ("conflict", 409),
        ("run-finished", 409),
        ("throttled", 429),
        ("broker-unavailable", 503),
        ("something-new", 400),
    ],
)
def test_a_refusal_answers_its_codes_status_with_the_code_as_type(code: str, status: int) -> None:
    assert _answer(ServiceError("not now", code=code)) == (
        status,
        {"error": {"type": code, "detail": "not now"}},
    )


def test_an_invalid_input_answers_400_naming_its_field() -> None:
    assert _answer(InvalidRunRequest("must be one of a, b", field="manifest")) == (
        400,
        {"error": {"type": "invalid", "fields": {"manifest": ["must be one of a, b"]}}},
    )
    assert _answer(ProfileServiceError("no field")) == (
        400,
        {"error": {"type": "invalid", "fields": {"non_field_errors": ["no field"]}}},
    )


def test_a_profile_documents_problems_are_listed_under_document() -> None:
    assert _answer(TWO_PROBLEMS) == (
        400,
        {
            "error": {
                "type": "invalid",
                "fields": {
                    "document": [
                        "workspace.concurrency: must be a positive integer",
                        "providers.jev: unknown key",
                    ]
                },
            }
        },
    )


def test_a_view_can_name_the_one_input_all_its_refusals_are_about() -> None:
    class Propose:
        refusal_field = "document"

    status, body = _answer(ProfileServiceError("too many pending", code="conflict"), Propose())
    assert status == 400
    assert body["error"]["fields"] == {"document": ["too many pending"]}


def test_the_core_and_engine_document_errors_are_service_errors() -> None:
    for error in (InvalidProfileError("a.b", "bad"), InvalidDefinitionError("a.b", "bad")):
        assert isinstance(error, ServiceError) and isinstance(error, ValueError)
        assert (error.code, error.field, error.message, str(error)) == (
            "invalid",
            "a.b",
            "bad",
            "a.b: bad",
        )
        assert error.summary() == "a.b: bad"


def test_a_summary_names_the_field_once() -> None:
    assert LoadRunBacklogFull("full").summary() == "full"
    assert InvalidRunRequest("is required", field="target").summary() == "target: is required"
    assert RunAlreadyFinished("ended", status="completed").code == "run-finished"


class _Form(forms.Form):
    document = forms.CharField(required=False)
    target = forms.CharField(required=False)


def test_the_admin_shows_a_refusal_at_its_field_or_the_document_or_above_the_form() -> None:
    form = _Form({})
    form.is_valid()
    form_refusal(form, TWO_PROBLEMS)
    form_refusal(form, InvalidRunRequest("is required", field="target"))
    form_refusal(form, InvalidRunRequest("too long", field="ruleset.x"), document="document")
    form_refusal(form, LoadRunBacklogFull("full"))
    assert form.errors == {
        "document": [
            "workspace.concurrency: must be a positive integer",
            "providers.jev: unknown key",
            "ruleset.x: too long",
        ],
        "target": ["is required"],
        "__all__": ["full"],
    }


def test_a_command_reports_every_problem_one_a_line() -> None:
    assert str(command_error(TWO_PROBLEMS)) == (
        "workspace.concurrency: must be a positive integer\nproviders.jev: unknown key"
    )
    assert str(command_error(InvalidRunRequest("is required", field="target"))) == (
        "target: is required"
    )


def test_an_unreadable_usage_range_names_its_parameter() -> None:
    error = UsageRangeError("end", "must be after start")
    assert _answer(error) == (
        400,
        {"error": {"type": "invalid", "fields": {"end": ["must be after start"]}}},
    )
    assert refusal_text(error) == "end: must be after start"
