"""Services: the propose → approve → activate → change → rollback story against the core."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from admission import selectors
from admission.core import InvalidProfileError, Profile
from admission.models import ProfileApproval, ProfileChangeRecord, RollbackRequest
from admission.runtime import registry as runtime
from admission.services import profiles as services
from tests.admission.conftest import ALL_CONFIRMED

pytestmark = pytest.mark.django_db


def _core_history(workspace_key: str) -> list[dict[str, Any]]:
    return [record.to_dict() for record in runtime.get_registry().profile_history(workspace_key)]


def _ledger(workspace: Any) -> list[ProfileChangeRecord]:
    return list(ProfileChangeRecord.objects.filter(workspace=workspace).order_by("id"))


def test_CNC_ADMIT_AUDIT_propose_approve_activate_change_rollback_matches_core(
    workspace, proposer, approver, make_document
):
    v1 = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    expected_v1 = Profile.from_dict(make_document("v1"), workspace_id="acme")
    assert (v1.digest, v1.profile_digest) == (expected_v1.digest, expected_v1.profile_digest)
    services.profile_version_approve(
        version=v1, approver=approver, checklist=ALL_CONFIRMED, comment="capacity checked"
    )
    initial = services.profile_version_activate(version=v1, actor=approver)

    v2 = services.profile_version_propose(
        workspace=workspace, document=make_document("v2", concurrency=2), proposed_by=proposer
    )
    services.profile_version_approve(version=v2, approver=approver, checklist=ALL_CONFIRMED)
    change = services.profile_version_activate(version=v2, actor=proposer)

    request = services.rollback_request_create(
        workspace=workspace, target=v1, requested_by=proposer, reason="v2 starves quiet lanes"
    )
    rollback = services.rollback_request_approve(request=request, approver=approver)

    assert [
        (r.kind, r.previous_profile_version, r.profile_version) for r in _ledger(workspace)
    ] == [
        ("initial", None, "v1"),
        ("change", "v1", "v2"),
        ("rollback", "v2", "v1"),
    ]
    # The database ledger holds exactly the records the core emitted, field for field.
    assert [r.to_dict() for r in _ledger(workspace)] == _core_history("acme")
    assert rollback.digest == initial.digest == v1.digest
    assert rollback.profile_digest == initial.profile_digest == v1.profile_digest
    assert change.digest != initial.digest
    assert rollback.approval.version == v1
    assert rollback.rollback_request == request
    request.refresh_from_db()
    assert request.status == RollbackRequest.Status.APPROVED
    assert request.decided_by == approver
    assert selectors.workspace_current_version(workspace=workspace) == v1
    assert runtime.get_registry().current_profile("acme").profile_version == "v1"


def test_CNC_ADMIT_AUDIT_v2_manifest_profile_digest_is_the_spec_value(
    workspace, proposer, make_document
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("load-offline-v2"), proposed_by=proposer
    )
    assert version.profile_digest == (
        "sha256:e88407c56f96adc79c87a5ff7ae8d45d90291eeecb242db2a9417e121ad3464b"
    )


def test_CNC_ADMIT_AUDIT_restarted_process_replays_the_ledger_before_activating(
    workspace, approver, approved
):
    v1, v2, v3 = approved("v1"), approved("v2", concurrency=2), approved("v3", concurrency=3)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    runtime.reset_registry()  # a new process: the registry knows nothing yet

    record = services.profile_version_activate(version=v3, actor=approver)

    assert (record.kind, record.previous_profile_version) == ("change", "v2")
    assert [r["kind"] for r in _core_history("acme")] == ["initial", "change", "change"]


@contextlib.contextmanager
def _another_process() -> Iterator[None]:
    """Run a block with a registry of its own, as a second process would, then switch back."""
    saved_registry, saved_applied = runtime._registry, dict(runtime._applied)
    runtime.reset_registry()
    try:
        yield
    finally:
        runtime._registry = saved_registry
        runtime._applied.clear()
        runtime._applied.update(saved_applied)


def test_CNC_ADMIT_AUDIT_a_stale_process_catches_up_before_it_activates(
    workspace, proposer, approver, approved
):
    v1, v2, v3 = approved("v1"), approved("v2", concurrency=2), approved("v3", concurrency=3)
    services.profile_version_activate(version=v1, actor=approver)
    with _another_process():
        services.profile_version_activate(version=v2, actor=approver)
        request = services.rollback_request_create(
            workspace=workspace, target=v1, requested_by=proposer
        )
        services.rollback_request_approve(request=request, approver=approver)
    stale = runtime.get_registry()
    assert [r.profile_version for r in stale.profile_history("acme")] == ["v1"]

    record = services.profile_version_activate(version=v3, actor=approver)

    assert (record.kind, record.previous_profile_version) == ("change", "v1")
    assert [(r.kind, r.profile_version) for r in stale.profile_history("acme")] == [
        ("initial", "v1"),
        ("change", "v2"),
        ("rollback", "v1"),
        ("change", "v3"),
    ]


def test_refresh_workspace_applies_what_another_process_activated(workspace, approver, approved):
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    with _another_process():
        services.profile_version_activate(version=v2, actor=approver)
    registry = runtime.get_registry()
    assert registry.current_profile("acme").profile_version == "v1"

    runtime.refresh_workspace("acme")  # what a pg_notify listener calls
    runtime.refresh_workspace("acme")  # and again: nothing new, nothing changes

    assert [r.profile_version for r in registry.profile_history("acme")] == ["v1", "v2"]
    assert registry.current_profile("acme").profile_version == "v2"


def test_get_registry_is_built_lazily_once_per_process(workspace, approver, approved):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    runtime.reset_registry()
    first = runtime.get_registry()
    assert first is runtime.get_registry()
    assert first.current_profile("acme").profile_version == "v1"


def test_invalid_document_names_the_field(workspace, proposer, make_document):
    document = make_document("bad")
    document["providers"]["jev"]["concurrency"] = 0
    with pytest.raises(InvalidProfileError) as caught:
        services.profile_version_propose(
            workspace=workspace, document=document, proposed_by=proposer
        )
    assert caught.value.field == "providers.jev.concurrency"
    assert not selectors.profile_version_list(workspace=workspace).exists()


def test_same_label_with_other_limits_is_a_conflict(workspace, proposer, make_document):
    services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(services.ProfileVersionConflict, match="other limits"):
        services.profile_version_propose(
            workspace=workspace, document=make_document("v1", concurrency=2), proposed_by=proposer
        )


def test_same_document_again_is_a_duplicate_pointing_at_the_existing_row(
    workspace, proposer, make_document
):
    first = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(services.ProfileVersionDuplicate) as caught:
        services.profile_version_propose(
            workspace=workspace, document=make_document("v1"), proposed_by=proposer
        )
    assert caught.value.version == first


def test_overlong_label_is_an_invalid_profile(workspace, proposer, make_document):
    with pytest.raises(InvalidProfileError) as caught:
        services.profile_version_propose(
            workspace=workspace, document=make_document("v" * 200), proposed_by=proposer
        )
    assert caught.value.field == "profileVersion"


def test_nul_characters_are_refused_before_the_database_sees_them(
    workspace, proposer, make_document
):
    document = make_document("v1")
    document["principals"][0]["class"] = "quiet\x00"
    with pytest.raises(InvalidProfileError) as caught:
        services.profile_version_propose(
            workspace=workspace, document=document, proposed_by=proposer
        )
    assert caught.value.field == "principals[0].class"


def test_proposer_cannot_approve_own_version(workspace, proposer, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(services.ProfileApprovalError, match="second person"):
        services.profile_version_approve(
            version=version, approver=proposer, checklist=ALL_CONFIRMED
        )
    assert not ProfileApproval.objects.exists()


def test_approval_needs_every_checklist_item(workspace, proposer, approver, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    partial = {**ALL_CONFIRMED, "diff-reviewed": False}
    with pytest.raises(services.ProfileApprovalError) as caught:
        services.profile_version_approve(version=version, approver=approver, checklist=partial)
    assert caught.value.field == "checklist"
    assert "diff-reviewed" in str(caught.value)


def test_a_version_is_decided_once(workspace, approver, approved, make_user):
    version = approved("v1")
    third = make_user("third")
    workspace.members.add(third, through_defaults={"role": "approver"})
    with pytest.raises(services.ProfileApprovalError, match="already been decided"):
        services.profile_version_reject(version=version, approver=third, comment="too late")


def test_rejection_needs_a_comment(workspace, proposer, approver, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(services.ProfileApprovalError) as caught:
        services.profile_version_reject(version=version, approver=approver, comment="  ")
    assert caught.value.field == "comment"


def test_only_approved_versions_activate(workspace, proposer, approver, make_document):
    pending = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    with pytest.raises(services.ProfileNotApproved, match="not approved yet"):
        services.profile_version_activate(version=pending, actor=approver)
    services.profile_version_reject(version=pending, approver=approver, comment="no")
    with pytest.raises(services.ProfileNotApproved, match="rejected"):
        services.profile_version_activate(version=pending, actor=approver)
    assert not ProfileChangeRecord.objects.exists()
    assert runtime.get_registry().profile_history("acme") == []


def test_activating_the_current_version_again_is_a_conflict(workspace, approver, approved):
    v1 = approved("v1")
    services.profile_version_activate(version=v1, actor=approver)
    with pytest.raises(services.ProfileActivationConflict, match="already the current"):
        services.profile_version_activate(version=v1, actor=approver)
    assert ProfileChangeRecord.objects.count() == 1


def test_reactivating_an_earlier_version_needs_a_rollback_request(workspace, approver, approved):
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    with pytest.raises(services.ProfileActivationConflict, match="request a rollback"):
        services.profile_version_activate(version=v1, actor=approver)


def test_rollback_request_rules(workspace, proposer, approver, approved, other_workspace):
    v1, v2, v3 = approved("v1"), approved("v2", concurrency=2), approved("v3", concurrency=3)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    with pytest.raises(services.RollbackRequestError, match="never active"):
        services.rollback_request_create(workspace=workspace, target=v3, requested_by=proposer)
    with pytest.raises(services.RollbackRequestError, match="already the current"):
        services.rollback_request_create(workspace=workspace, target=v2, requested_by=proposer)
    other_workspace.members.add(proposer, through_defaults={"role": "operator"})
    with pytest.raises(services.RollbackRequestError, match="does not belong"):
        services.rollback_request_create(
            workspace=other_workspace, target=v1, requested_by=proposer
        )
    request = services.rollback_request_create(
        workspace=workspace, target=v1, requested_by=proposer
    )
    with pytest.raises(services.RollbackRequestError, match="pending"):
        services.rollback_request_create(workspace=workspace, target=v1, requested_by=approver)
    with pytest.raises(services.RollbackRequestError, match="someone other"):
        services.rollback_request_approve(request=request, approver=proposer)
    rejected = services.rollback_request_reject(
        request=request, approver=approver, comment="not at peak"
    )
    assert rejected.status == RollbackRequest.Status.REJECTED
    with pytest.raises(services.RollbackRequestError, match="already rejected"):
        services.rollback_request_approve(request=request, approver=approver)
    assert selectors.workspace_current_version(workspace=workspace) == v2


def test_a_failed_activation_leaves_no_record_and_rebuilds_the_registry(
    workspace, approver, approved, monkeypatch
):
    v1 = approved("v1")

    def broken(_workspace: Any) -> None:
        raise RuntimeError("notification channel down")

    monkeypatch.setattr(services, "_notify", broken)
    with pytest.raises(RuntimeError):
        services.profile_version_activate(version=v1, actor=approver)
    assert not ProfileChangeRecord.objects.exists()
    # The registry had moved; it was dropped and is rebuilt from the (empty) ledger.
    assert runtime.get_registry().current_profile("acme") is None
