"""Cancel, progress, per-caller submission throttling and the ruleset size limit, through the
REST API in this process (no worker: a submitted run stays `queued` here; the real worker's side
is in tests/service/test_cancel.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, Receipt, ReceiptSlot
from evaluator.services import runs as services

pytestmark = pytest.mark.django_db

RUNS = "/api/workspaces/demo/evaluations/"


def _user(name: str, workspace: Workspace | None = None, role: str = "member") -> Any:
    user = get_user_model().objects.create_user(username=name)
    if workspace is not None:
        workspace.members.add(user, through_defaults={"role": role})
    return user


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _submit(client: APIClient, decisions: int = 3) -> dict[str, Any]:
    response = client.post(RUNS, example_request(decisions), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _cancel(client: APIClient, run_id: str) -> Any:
    return client.post(f"{RUNS}{run_id}/cancel/")


def test_a_queued_run_is_cancelled_at_once(demo):
    mia = _user("mia", demo)
    client = _client(mia)
    run = _submit(client)
    assert run["status"] == "queued"
    assert run["progress"] == {
        "decisionsTotal": 3,
        "decisionsDone": 0,
        "outcomes": {},
        "attempts": 0,
        "inFlight": [],
        "maxInFlight": 0,
        "refusals": {},
        "outage": None,
    }

    response = _cancel(client, run["id"])
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["cancelRequestedBy"] == "mia"
    assert body["cancelRequestedAt"] is not None
    assert body["finishedAt"] is not None
    assert [(d["decisionId"], d["status"]) for d in body["result"]["decisions"]] == [
        ("check-1", "cancelled"),
        ("check-2", "cancelled"),
        ("check-3", "cancelled"),
    ]
    assert body["result"]["status"] == "cancelled"
    assert body["result"]["succeeded"] is False
    assert body["attempts"] == []
    assert body["progress"]["decisionsDone"] == 3
    assert body["progress"]["outcomes"] == {"cancelled": 3}

    again = _cancel(client, run["id"])
    assert again.status_code == 409
    assert again.json()["error"]["type"] == "run-finished"
    assert "cancelled" in again.json()["error"]["detail"]

    # No worker took it (tests/service/test_cancel.py shows one never does afterwards).
    stored = EvaluationRun.objects.get(pk=run["id"])
    assert (stored.deliveries, stored.started_at) == (0, None)
    assert not Receipt.objects.exists()
    listed = client.get(RUNS).json()["results"][0]
    assert listed["status"] == "cancelled"
    assert listed["cancelRequestedBy"] == "mia"


def test_members_cancel_their_own_runs_and_operators_anybodys(demo):
    mia, max_ = _user("mia", demo), _user("max", demo)
    viewer, stranger = _user("vic", demo, role="viewer"), _user("otto")
    operator = get_user_model().objects.get(username="demo-approver")
    first, second = _submit(_client(mia)), _submit(_client(mia))

    refused = _cancel(_client(max_), first["id"])
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "type": "permission_denied",
        "detail": "you may cancel only your own evaluation runs in workspace demo",
    }
    read_only = _cancel(_client(viewer), first["id"])
    assert read_only.status_code == 403
    assert read_only.json()["error"]["type"] == "permission_denied"
    assert _cancel(_client(stranger), first["id"]).status_code == 404
    assert EvaluationRun.objects.get(pk=first["id"]).status == "queued"
    assert EvaluationRun.objects.get(pk=first["id"]).cancel_requested_at is None

    by_operator = _cancel(_client(operator), first["id"])
    assert by_operator.status_code == 200
    assert by_operator.json()["cancelRequestedBy"] == "demo-approver"
    assert _cancel(_client(mia), second["id"]).status_code == 200

    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        response = _cancel(_client(mia), missing)
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found"
    assert _client(mia).get(f"{RUNS}{second['id']}/cancel/").status_code == 405


def test_a_running_run_keeps_running_with_the_request_recorded_until_its_worker_ends_it(demo):
    mia = _user("mia", demo)
    client = _client(mia)
    run = _submit(client)
    EvaluationRun.objects.filter(pk=run["id"]).update(status="running", deliveries=1)

    response = _cancel(client, run["id"])
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "running"
    assert body["cancelRequestedBy"] == "mia"
    requested_at = body["cancelRequestedAt"]
    assert requested_at is not None
    assert body["result"] is None

    # Asking again changes nothing: the first request stands.
    operator = get_user_model().objects.get(username="demo-approver")
    again = _cancel(_client(operator), run["id"])
    assert again.status_code == 202
    assert again.json()["cancelRequestedAt"] == requested_at
    assert again.json()["cancelRequestedBy"] == "mia"
    assert EvaluationRun.objects.get(pk=run["id"]).status == "running"


def _receipt_document(run: EvaluationRun, *, revision: int = 4) -> dict[str, Any]:
    evidence = {"decision": "admit", "reason": "admitted", "queueDelayMs": 1.5, "active": 1}
    return {
        "schema": "decision-evaluation-receipt/v2",
        "invocationId": run.invocation_id,
        "rulesetId": run.ruleset_id,
        "rulesetDigest": run.ruleset_digest,
        "state": "running",
        "revision": revision,
        "pendingDispatch": {
            "decisionIndex": 1,
            "targetIndex": 0,
            "adapterId": "fake",
            "model": "demo-model",
            "number": 1,
            "startedMs": 12.0,
            "evidence": evidence,
            "atEpochMs": 1.0,
        },
        "decisions": [
            {
                "decisionId": "check-1",
                "status": "succeeded",
                "output": "yes",
                "attempts": [
                    {
                        "targetIndex": 0,
                        "adapterId": "fake",
                        "model": "demo-model",
                        "number": 1,
                        "sent": True,
                        "outcome": "succeeded",
                        "reason": "answered",
                        "retryable": False,
                        "startedMs": 0.0,
                        "endedMs": 10.0,
                        "evidence": evidence,
                    }
                ],
            },
            {"decisionId": "check-2", "status": None, "output": None, "attempts": []},
            {"decisionId": "check-3", "status": None, "output": None, "attempts": []},
        ],
        "createdAtEpochMs": 0.0,
        "updatedAtEpochMs": 1.0,
    }


def _store_receipt(run: EvaluationRun) -> Receipt:
    document = _receipt_document(run)
    return Receipt.objects.create(
        workspace_id="demo",
        principal_id=run.principal_id,
        invocation_id=run.invocation_id,
        ruleset_id=run.ruleset_id,
        ruleset_digest=run.ruleset_digest,
        state="running",
        revision=document["revision"],
        document=document,
    )


def test_a_running_run_shows_its_progress_from_the_receipt_its_worker_writes(demo):
    mia = _user("mia", demo)
    client = _client(mia)
    submitted = _submit(client)
    run = EvaluationRun.objects.get(pk=submitted["id"])
    EvaluationRun.objects.filter(pk=run.pk).update(status="running", deliveries=1)
    _store_receipt(run)

    body = client.get(f"{RUNS}{run.pk}/").json()
    assert body["status"] == "running"
    assert body["result"] is None
    assert body["progress"] == {
        "decisionsTotal": 3,
        "decisionsDone": 1,
        "outcomes": {"succeeded": 1},
        "attempts": 1,
        "inFlight": [
            {
                "decisionId": "check-2",
                "adapterId": "fake",
                "model": "demo-model",
                "number": 1,
                "evidence": {
                    "decision": "admit",
                    "reason": "admitted",
                    "queueDelayMs": 1.5,
                    "active": 1,
                },
            }
        ],
        "maxInFlight": 1,
        "refusals": {},
        "outage": None,
    }
    assert [
        (a["decisionId"], a["outcome"], a["evidence"]["decision"]) for a in body["attempts"]
    ] == [("check-1", "succeeded", "admit")]


def test_a_queued_run_with_a_receipt_keeps_what_it_recorded_and_the_receipt_is_closed(demo):
    mia = _user("mia", demo)
    client = _client(mia)
    submitted = _submit(client)
    run = EvaluationRun.objects.get(pk=submitted["id"])
    receipt = _store_receipt(run)

    body = _cancel(client, submitted["id"]).json()
    assert body["status"] == "cancelled"
    assert [(d["decisionId"], d["status"]) for d in body["result"]["decisions"]] == [
        ("check-1", "succeeded"),
        ("check-2", "execution-uncertain"),
        ("check-3", "cancelled"),
    ]
    assert [(a["decisionId"], a["sent"], a["reason"]) for a in body["attempts"]] == [
        ("check-1", True, "answered"),
        ("check-2", True, "dispatch-unconfirmed"),
    ]
    receipt.refresh_from_db()
    assert receipt.state == "cancelled"
    assert receipt.revision == 5
    assert receipt.pending_dispatches == 0
    assert receipt.document["state"] == "cancelled"
    assert receipt.document["revision"] == 5
    # The v2 receipt was closed as v3, its one slot resolved.
    assert receipt.schema == receipt.document["schema"] == "decision-evaluation-receipt/v3"
    assert receipt.full_document()["pendingDispatches"] == []
    assert "pendingDispatch" not in receipt.document


def _v3_with_two_calls_in_flight(run: EvaluationRun) -> Receipt:
    v2 = _receipt_document(run)
    slot = {"decisionId": "check-2", **v2.pop("pendingDispatch")}
    third = {**slot, "decisionId": "check-3", "decisionIndex": 2, "startedMs": 13.0}
    document = {**v2, "schema": "decision-evaluation-receipt/v3", "maxPendingDispatches": 3}
    receipt = Receipt.objects.create(
        workspace_id="demo",
        principal_id=run.principal_id,
        invocation_id=run.invocation_id,
        ruleset_id=run.ruleset_id,
        ruleset_digest=run.ruleset_digest,
        schema=document["schema"],
        state="running",
        revision=document["revision"],
        document=document,
    )
    # A v3 receipt keeps its slots as rows of their own.
    for each in (third, slot):
        ReceiptSlot.objects.create(
            receipt=receipt,
            decision_index=each["decisionIndex"],
            target_index=each["targetIndex"],
            number=each["number"],
            slot=each,
        )
    assert receipt.pending_dispatches == 2
    return receipt


def test_progress_shows_every_call_in_flight_and_a_cancel_resolves_every_slot(demo):
    mia = _user("mia", demo)
    client = _client(mia)
    submitted = _submit(client)
    run = EvaluationRun.objects.get(pk=submitted["id"])
    EvaluationRun.objects.filter(pk=run.pk).update(status="running", deliveries=1)
    receipt = _v3_with_two_calls_in_flight(run)

    progress = client.get(f"{RUNS}{run.pk}/").json()["progress"]
    assert [(f["decisionId"], f["number"]) for f in progress["inFlight"]] == [
        ("check-2", 1),
        ("check-3", 1),
    ]
    assert progress["maxInFlight"] == 3
    # The admin's run page and the receipt list show every call in flight too.
    get_user_model().objects.filter(pk=mia.pk).update(is_staff=True)
    browser = Client()
    browser.force_login(mia)
    page = browser.get(f"/admin/evaluator/evaluationrun/{run.pk}/change/").content.decode()
    assert "2 in flight: check-2 on fake #1 (admission: admit), check-3 on fake #1" in page
    assert "at most 3 in flight at once" in page
    receipts = browser.get("/admin/evaluator/receipt/").content.decode()
    assert "2 (3)" in receipts
    # The receipt list filters on calls in flight, counted from the slot rows.
    some = browser.get("/admin/evaluator/receipt/?in_flight=yes").content.decode()
    none = browser.get("/admin/evaluator/receipt/?in_flight=no").content.decode()
    assert run.invocation_id in some and run.invocation_id not in none

    # Taken back to the backlog (its worker died), then cancelled while queued.
    EvaluationRun.objects.filter(pk=run.pk).update(status="queued")
    body = _cancel(client, submitted["id"]).json()
    assert [(d["decisionId"], d["status"]) for d in body["result"]["decisions"]] == [
        ("check-1", "succeeded"),
        ("check-2", "execution-uncertain"),
        ("check-3", "execution-uncertain"),
    ]
    assert [(a["decisionId"], a["reason"]) for a in body["attempts"]] == [
        ("check-1", "answered"),
        ("check-2", "dispatch-unconfirmed"),
        ("check-3", "dispatch-unconfirmed"),
    ]
    receipt.refresh_from_db()
    assert receipt.state == "cancelled" and receipt.pending_dispatches == 0
    assert not ReceiptSlot.objects.filter(receipt=receipt).exists()
    assert receipt.full_document()["pendingDispatches"] == []
    assert receipt.document["maxPendingDispatches"] == 3


def test_a_ruleset_above_the_deployment_limit_is_a_typed_400_naming_the_field(demo, settings):
    client = _client(_user("mia", demo))
    settings.SLUICE_MAX_DECISIONS = 3
    response = client.post(RUNS, example_request(4), format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert fields == {
        "ruleset.decisions": [
            "holds 4 decisions; this deployment takes at most 3 per evaluation "
            "(SLUICE_MAX_DECISIONS)"
        ]
    }
    assert not EvaluationRun.objects.exists()
    assert _submit(client, 3)["decisionCount"] == 3

    # The setting cannot raise the engine's own ceiling (the body is too large for the API).
    settings.SLUICE_MAX_DECISIONS = 50_000
    with pytest.raises(services.InvalidRunRequest) as refused:
        services.evaluation_run_submit(
            demo, get_user_model().objects.get(username="mia"), example_request(10_001)
        )
    assert refused.value.field == "ruleset.decisions"
    assert "at most 10000" in str(refused.value)
    assert EvaluationRun.objects.count() == 1


def test_the_default_limit_takes_a_thousand_decisions_and_refuses_more(demo):
    client = _client(_user("mia", demo))
    response = client.post(RUNS, example_request(1001), format="json")
    assert response.status_code == 400
    assert "at most 1000" in response.json()["error"]["fields"]["ruleset.decisions"][0]
    assert _submit(client, 1000)["decisionCount"] == 1000


def test_each_caller_has_a_submission_budget_and_a_refusal_says_when_to_retry(demo, settings):
    settings.SLUICE_THROTTLE_RATES = {
        "anon": None,
        "user": None,
        "workspace": None,
        "submit": "2/minute",
    }
    mia, max_ = _client(_user("mia", demo)), _client(_user("max", demo))
    first, _ = _submit(mia, 1), _submit(mia, 1)
    refused = mia.post(RUNS, example_request(1), format="json")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    assert refused.json()["error"]["type"] == "throttled"
    assert EvaluationRun.objects.filter(principal_id="mia").count() == 2
    # Another caller has a budget of its own; reading and cancelling spend no submissions.
    _submit(max_, 1)
    assert mia.get(f"{RUNS}{first['id']}/").status_code == 200
    assert _cancel(mia, first["id"]).status_code == 200


def test_the_openapi_schema_describes_cancel_progress_and_the_throttled_submission(demo):
    client = _client(_user("mia", demo))
    schema = client.get("/api/schema/?format=json").json()
    cancel = schema["paths"]["/api/workspaces/{workspace_key}/evaluations/{run_id}/cancel/"]
    assert set(cancel) == {"post"}
    assert sorted(cancel["post"]["responses"]) == ["200", "202", "403", "404", "409"]
    assert "requestBody" not in cancel["post"]
    submit = schema["paths"]["/api/workspaces/{workspace_key}/evaluations/"]["post"]
    assert submit["responses"]["429"]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    run = schema["components"]["schemas"]["EvaluationRun"]["properties"]
    assert run["progress"]["allOf"] == [{"$ref": "#/components/schemas/RunProgress"}]
    assert {"cancelRequestedAt", "cancelRequestedBy", "attempts"} <= set(run)
