"""Immutability at three depths, four-eyes and one-pending constraints, PROTECT on the trail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import ProtectedError

from admission.models import (
    ImmutableRecordError,
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
)
from admission.services import profiles as services

pytestmark = pytest.mark.django_db

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbooks" / "RUN-JEV-ADMISSION-v1.md"


@pytest.fixture
def ledger(workspace, proposer, approver, approved):
    """Two activations and a rollback request: one row in every audit table."""
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    request = services.rollback_request_create(
        workspace=workspace, target=v1, requested_by=proposer
    )
    return {"v1": v1, "v2": v2, "request": request}


@pytest.mark.parametrize("model", [ProfileVersion, ProfileApproval, ProfileChangeRecord])
def test_model_save_and_delete_refuse_existing_rows(ledger, model):
    row = model.objects.first()
    with pytest.raises(ImmutableRecordError):
        row.save()
    with pytest.raises(ImmutableRecordError):
        row.delete()


@pytest.mark.parametrize("model", [ProfileVersion, ProfileApproval, ProfileChangeRecord])
def test_queryset_update_and_delete_refuse(ledger, model):
    with pytest.raises(ImmutableRecordError):
        model.objects.all().update(pk=1)
    with pytest.raises(ImmutableRecordError):
        model.objects.all().delete()
    with pytest.raises(ImmutableRecordError):
        model.objects.bulk_update(list(model.objects.all()), ["pk"])
    assert model.objects.exists()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("table", "assignment"),
    [
        ("admission_profileversion", "profile_version = 'forged'"),
        ("admission_profileapproval", "decision = 'reject'"),
        ("admission_profilechangerecord", "kind = 'change'"),
    ],
)
def test_postgres_trigger_refuses_raw_update_and_delete(ledger, table, assignment):
    for statement in (f"UPDATE {table} SET {assignment}", f"DELETE FROM {table}"):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone()[0] > 0


@pytest.mark.postgres
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE admission_rollbackrequest SET status = 'pending', decided_by_id = NULL, "
        "decided_at = NULL",
        "UPDATE admission_rollbackrequest SET comment = 'rewritten afterwards'",
        "UPDATE admission_rollbackrequest SET decided_by_id = requested_by_id",
        "UPDATE admission_rollbackrequest SET reason = 'forged'",
        "DELETE FROM admission_rollbackrequest",
    ],
)
def test_postgres_trigger_keeps_decided_rollback_requests_append_only(ledger, approver, statement):
    services.rollback_request_reject(request=ledger["request"], approver=approver, comment="no")
    with (
        pytest.raises(DatabaseError, match="admission: "),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    decided = RollbackRequest.objects.get()
    assert (decided.status, decided.comment, decided.decided_by) == ("rejected", "no", approver)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE admission_rollbackrequest SET reason = 'forged', status = 'rejected', "
        "decided_by_id = {approver}, decided_at = now()",
        "UPDATE admission_rollbackrequest SET target_id = {v2}",
        "UPDATE admission_rollbackrequest SET comment = 'still pending'",
        "DELETE FROM admission_rollbackrequest",
    ],
)
def test_postgres_trigger_lets_a_pending_request_change_only_by_being_decided(
    ledger, approver, statement
):
    sql = statement.format(approver=approver.pk, v2=ledger["v2"].pk)
    with (
        pytest.raises(DatabaseError, match="admission: "),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert RollbackRequest.objects.get().status == "pending"
    services.rollback_request_approve(request=ledger["request"], approver=approver)
    assert RollbackRequest.objects.get().status == "approved"


@pytest.mark.postgres
def test_postgres_trigger_refuses_an_approval_whose_proposer_is_not_the_versions(
    workspace, proposer, approver, make_user, make_document
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    third = make_user("third")
    # Claiming someone else proposed it would dodge the four-eyes CHECK; the trigger stops that.
    with pytest.raises(DatabaseError, match="proposer"), transaction.atomic():
        ProfileApproval.objects.create(
            version=version, proposed_by=third, approver=proposer, decision="approve"
        )


def test_approver_equal_to_proposer_fails_in_the_database(workspace, proposer, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        # Straight to the ORM, past the service's own check: the CHECK constraint refuses it.
        ProfileApproval.objects.create(
            version=version, proposed_by=proposer, approver=proposer, decision="approve"
        )
    assert not ProfileApproval.objects.exists()


def test_one_pending_rollback_per_workspace_is_a_database_constraint(ledger, approver):
    with pytest.raises(IntegrityError), transaction.atomic():
        RollbackRequest.objects.create(
            workspace=ledger["request"].workspace, target=ledger["v1"], requested_by=approver
        )


def test_rollback_decider_differs_from_requester_in_the_database(ledger, proposer):
    request = ledger["request"]
    request.status = RollbackRequest.Status.REJECTED
    request.decided_by = proposer
    with pytest.raises(IntegrityError), transaction.atomic():
        request.save()


def test_label_is_unique_per_workspace(workspace, proposer, make_document):
    services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        ProfileVersion.objects.create(
            workspace=workspace,
            profile_version="v1",
            document={},
            digest="sha256:x",
            profile_digest="sha256:y",
            proposed_by=proposer,
        )


def test_audit_trail_is_protected_from_cascades(ledger, proposer, workspace):
    with pytest.raises(ProtectedError):
        proposer.delete()
    with pytest.raises(ProtectedError):
        workspace.delete()


def test_change_record_to_dict_is_the_v1_record(ledger):
    record = ProfileChangeRecord.objects.order_by("id").last()
    assert record.to_dict() == {
        "schema": "decision-admission-profile-change/v1",
        "workspaceId": "acme",
        "kind": "change",
        "previousProfileVersion": "v1",
        "profileVersion": "v2",
        "digest": ledger["v2"].digest,
        "profileDigest": ledger["v2"].profile_digest,
        "atEpochMs": record.at_epoch_ms,
    }


def test_custom_permissions_exist():
    codenames = {codename for codename, _ in ProfileVersion._meta.permissions}
    assert codenames == {"approve_profileversion", "activate_profileversion"}


def test_runbook_document_lists_every_checklist_question():
    text = RUNBOOK.read_text(encoding="utf-8")
    listed = re.findall(r"^- \[ \] `([a-z-]+)`", text, flags=re.MULTILINE)
    assert listed == [key for key, _ in services.RUNBOOK_CHECKLIST]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("table", "assignment"),
    [
        ("admission_rolloutevent", "reason = 'forged'"),
        ("admission_shadowobservation", "run_id = 'forged'"),
        ("admission_runboundary", "parallel_allowed = NOT parallel_allowed"),
    ],
)
def test_postgres_trigger_keeps_rollout_rows_append_only(
    workspace, proposer, approver, approved, table, assignment
):
    from admission.services import rollout

    current, candidate = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=current, actor=approver)
    shadow = rollout.shadow_start(version=candidate, actor=proposer)
    rollout.shadow_observation_record(
        session_id=shadow.pk, run_id="r", active={"requests": 1}, shadow={"requests": 1}
    )
    rollout.run_plan(workspace=workspace, principal_id="p", invocation_id="i", run_id="r")
    for statement in (f"UPDATE {table} SET {assignment}", f"DELETE FROM {table}"):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone()[0] == 1
