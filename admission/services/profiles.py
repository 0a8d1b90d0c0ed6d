"""The only write path for profiles: propose, decide, activate, roll back.

Each service validates with the core, writes in one transaction and leaves an audit row.
Every service first asks `admission.access` whether its actor may do this in the workspace and
raises `access.AccessDenied` (a 403, an admin message, a CommandError) if not. Other failures are
typed (`ProfileServiceError` subclasses, or the core's `InvalidProfileError`: both
`admission.core.ServiceError`s), so every interface turns them into a form error, a 4xx, or a
CommandError in one place of its own.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from admission import access, selectors
from admission.core import InvalidProfileError, Profile, ProfileConflictError, ServiceError
from admission.models import (
    RUNBOOK_ID,
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)
from admission.runtime import registry as runtime
from admission.runtime.refresh import NOTIFY_CHANNEL
from admission.services.profile_problems import InvalidProfileDocument, profile_problems

if TYPE_CHECKING:
    from django.contrib.auth.models import User

LABEL_MAX_LENGTH = ProfileVersion._meta.get_field("profile_version").max_length or 128

# The checklist of docs/runbooks/RUN-JEV-ADMISSION-v1.md; a test keeps the two in step.
RUNBOOK_CHECKLIST: tuple[tuple[str, str], ...] = (
    (
        "capacity-documented",
        "Every provider ceiling is at or below the provider's documented capacity.",
    ),
    (
        "diff-reviewed",
        "I read the diff against the current version and every change is intended.",
    ),
    (
        "offline-manifest-passed",
        "The offline load manifest passes with these limits (or the change only tightens them).",
    ),
    (
        "rollback-target-known",
        "The version to roll back to is known and was itself approved.",
    ),
    (
        "reservations-fit",
        "Reserved concurrency and principal shares leave room for every other principal.",
    ),
)

__all__ = [
    "NOTIFY_CHANNEL",
    "RUNBOOK_CHECKLIST",
    "InvalidProfileError",
    "ProfileActivationConflict",
    "ProfileApprovalError",
    "ProfileNotApproved",
    "ProfilePendingLimit",
    "ProfileServiceError",
    "ProfileVersionConflict",
    "ProfileVersionDuplicate",
    "RollbackRequestError",
    "profile_document_check",
    "profile_version_activate",
    "profile_version_approve",
    "profile_version_propose",
    "profile_version_reject",
    "rollback_request_approve",
    "rollback_request_create",
    "rollback_request_reject",
]


class ProfileServiceError(ServiceError):
    """A profile operation was refused; `field` names the input at fault when there is one.

    `code` says what kind of refusal it is: `invalid` (the input), `conflict` (the state of the
    workspace or version does not allow it now) or `four_eyes` (the same person may not do both
    halves); the API answers 400, 409 and 403 for them.
    """


class ProfileVersionConflict(ProfileServiceError):
    """The label already exists in the workspace with other limits (the core's conflict)."""

    field = "document"


class ProfileVersionDuplicate(ProfileServiceError):
    """The same document was proposed again; `version` is the row that already holds it."""

    field = "document"

    def __init__(self, message: str, *, version: ProfileVersion) -> None:
        super().__init__(message)
        self.version = version


class ProfileApprovalError(ProfileServiceError):
    """A decision was refused: four eyes, already decided, or an incomplete checklist."""


class ProfileNotApproved(ProfileServiceError):
    """Activation needs an approving decision first."""

    code = "conflict"


class ProfileActivationConflict(ProfileServiceError):
    """Another activation won, or the version's state does not allow this activation."""

    code = "conflict"


class RollbackRequestError(ProfileServiceError):
    """A rollback request cannot be created or decided as asked."""


class ProfilePendingLimit(ProfileServiceError):
    """The workspace already keeps the most versions awaiting a decision that it may."""

    field = "document"
    code = "conflict"


def profile_document_check(workspace: Workspace, document: Any) -> Profile:
    """Parse `document` with the core for `workspace`; raises `InvalidProfileError` (an
    `InvalidProfileDocument` listing every problem of the document when the core refuses it).

    The deployment's caps come first, so an oversized document is refused before it is parsed:
    at most `SLUICE_MAX_PROFILE_BYTES` as compact JSON, at most `SLUICE_MAX_PROFILE_PRINCIPALS`
    principals.
    """
    _check_document_size(document)
    try:
        profile = Profile.from_dict(document, workspace_id=workspace.key)
    except InvalidProfileError:
        # Every problem at once, so the author fixes the document in one go.
        problems = profile_problems(document, workspace_id=workspace.key)
        raise InvalidProfileDocument(problems) from None
    _refuse_nul(document, "")
    if len(profile.profile_version) > LABEL_MAX_LENGTH:
        raise InvalidProfileError(
            "profileVersion", f"must be at most {LABEL_MAX_LENGTH} characters here"
        )
    return profile


def _check_document_size(document: Any) -> None:
    if not isinstance(document, Mapping):
        return  # the core names the problem
    limit = settings.SLUICE_MAX_PROFILE_BYTES
    try:
        size = len(json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        return  # not JSON at all: the core names the problem
    except UnicodeEncodeError:
        return  # a lone surrogate: the checks after parsing name it
    if size > limit:
        raise InvalidProfileError(
            "profile",
            f"is {size} bytes as compact JSON; this deployment keeps profiles of at most "
            f"{limit} bytes (SLUICE_MAX_PROFILE_BYTES)",
        )
    principals = document.get("principals")
    most = settings.SLUICE_MAX_PROFILE_PRINCIPALS
    if isinstance(principals, Mapping | list) and len(principals) > most:
        raise InvalidProfileError(
            "principals",
            f"names {len(principals)} principals; this deployment allows at most {most} per "
            "profile (SLUICE_MAX_PROFILE_PRINCIPALS)",
        )


def _refuse_nul(value: Any, path: str) -> None:
    # PostgreSQL's jsonb cannot hold U+0000; refuse it on every database alike.
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidProfileError(path or "profile", "contains a NUL character")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            _refuse_nul(key, where)
            _refuse_nul(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_nul(item, f"{path}[{index}]")


def profile_version_propose(
    *, workspace: Workspace, document: Mapping[str, Any], proposed_by: User
) -> ProfileVersion:
    """Store a new immutable profile version after the core has validated it.

    Raises `InvalidProfileError` for a bad document, `ProfileVersionConflict` when the label
    exists with other limits, and `ProfileVersionDuplicate` when the same limits were already
    proposed under this label.
    """
    access.require(proposed_by, access.PROPOSE, workspace)
    profile = profile_document_check(workspace, document)
    existing = selectors.profile_version_get(workspace=workspace, label=profile.profile_version)
    if existing is not None:
        _refuse_existing(existing, profile)
    try:
        with transaction.atomic():
            _check_pending_room(workspace)
            return ProfileVersion.objects.create(
                workspace=workspace,
                profile_version=profile.profile_version,
                document=document,
                digest=profile.digest,
                profile_digest=profile.profile_digest,
                proposed_by=proposed_by,
            )
    except IntegrityError:
        # A concurrent proposal took the label between the check and the insert.
        existing = selectors.profile_version_get(workspace=workspace, label=profile.profile_version)
        if existing is None:
            raise
        _refuse_existing(existing, profile)
        raise


def _check_pending_room(workspace: Workspace) -> None:
    # The workspace row's lock makes the count and the insert one step for concurrent proposals.
    Workspace.objects.select_for_update().filter(pk=workspace.pk).exists()
    pending = ProfileVersion.objects.filter(workspace=workspace, approvals__isnull=True).count()
    limit = settings.SLUICE_MAX_PENDING_VERSIONS
    if pending >= limit:
        raise ProfilePendingLimit(
            f"workspace {workspace.key!r} already has {pending} versions awaiting approval, the "
            f"most this deployment keeps (SLUICE_MAX_PENDING_VERSIONS); approve or reject some "
            "first"
        )


def _refuse_existing(existing: ProfileVersion, profile: Profile) -> None:
    if existing.profile_digest != profile.profile_digest:
        raise ProfileVersionConflict(
            f"profileVersion {profile.profile_version!r} already exists in workspace "
            f"{existing.workspace.key!r} with other limits ({existing.profile_digest}); "
            "publish the change under a new profileVersion"
        )
    raise ProfileVersionDuplicate(
        f"profileVersion {profile.profile_version!r} was already proposed with these limits",
        version=existing,
    )


def profile_version_approve(
    *,
    version: ProfileVersion,
    approver: User,
    checklist: Mapping[str, Any],
    comment: str = "",
) -> ProfileApproval:
    """Approve under RUN-JEV-ADMISSION-v1: every checklist item confirmed, approver ≠ proposer."""
    access.require(approver, access.APPROVE, version.workspace)
    missing = [key for key, _ in RUNBOOK_CHECKLIST if checklist.get(key) is not True]
    if missing:
        raise ProfileApprovalError(
            f"approval needs every {RUNBOOK_ID} checklist item confirmed; missing: "
            + ", ".join(missing),
            field="checklist",
        )
    return _decide(
        version=version,
        approver=approver,
        decision=ProfileApproval.Decision.APPROVE,
        checklist=checklist,
        comment=comment,
    )


def profile_version_reject(
    *,
    version: ProfileVersion,
    approver: User,
    checklist: Mapping[str, Any] | None = None,
    comment: str,
) -> ProfileApproval:
    """Reject a version; the comment says why and is required."""
    access.require(approver, access.APPROVE, version.workspace)
    if not comment.strip():
        raise ProfileApprovalError("a rejection needs a comment saying why", field="comment")
    return _decide(
        version=version,
        approver=approver,
        decision=ProfileApproval.Decision.REJECT,
        checklist=checklist or {},
        comment=comment,
    )


def _decide(
    *,
    version: ProfileVersion,
    approver: User,
    decision: str,
    checklist: Mapping[str, Any],
    comment: str,
) -> ProfileApproval:
    if approver.pk == version.proposed_by_id:
        raise ProfileApprovalError(
            f"{version} was proposed by {approver}; a second person must decide it",
            code="four_eyes",
        )
    known = {key for key, _ in RUNBOOK_CHECKLIST}
    answers = {key: bool(value) for key, value in checklist.items() if key in known}
    try:
        with transaction.atomic():
            return ProfileApproval.objects.create(
                version=version,
                proposed_by_id=version.proposed_by_id,
                approver=approver,
                decision=decision,
                runbook=RUNBOOK_ID,
                checklist=answers,
                comment=comment,
            )
    except IntegrityError as error:
        if ProfileApproval.objects.filter(version=version).exists():
            raise ProfileApprovalError(
                f"{version} has already been decided", code="conflict"
            ) from error
        raise


def profile_version_activate(*, version: ProfileVersion, actor: User) -> ProfileChangeRecord:
    """Make an approved, never-activated version current, in one transaction.

    Locks the workspace row, checks the current version inside the lock, registers the profile
    with this process's registry, writes the change record the core emitted and notifies other
    processes. Re-activating an earlier version needs a rollback request instead.
    Raises `ProfileNotApproved` or `ProfileActivationConflict`.
    """
    access.require(actor, access.ACTIVATE, version.workspace)
    return _activate(version=version, actor=actor, rollback_request=None)


def rollback_request_create(
    *,
    workspace: Workspace,
    target: ProfileVersion,
    requested_by: User,
    reason: str = "",
) -> RollbackRequest:
    """Ask to activate an earlier version again; a second person approves it."""
    access.require(requested_by, access.ACTIVATE, workspace)
    if target.workspace_id != workspace.pk:
        raise RollbackRequestError(f"{target} does not belong to workspace {workspace.key}")
    if not selectors.profile_version_was_activated(version=target):
        raise RollbackRequestError(
            f"{target} was never active; activate it instead of rolling back to it"
        )
    current = selectors.workspace_current_version(workspace=workspace)
    if current is not None and current.pk == target.pk:
        raise RollbackRequestError(f"{target} is already the current version")
    try:
        with transaction.atomic():
            return RollbackRequest.objects.create(
                workspace=workspace, target=target, requested_by=requested_by, reason=reason
            )
    except IntegrityError as error:
        if selectors.rollback_request_pending(workspace=workspace) is not None:
            raise RollbackRequestError(
                f"workspace {workspace.key} already has a pending rollback request",
                code="conflict",
            ) from error
        raise


def rollback_request_approve(
    *, request: RollbackRequest, approver: User, comment: str = ""
) -> ProfileChangeRecord:
    """Approve a pending rollback and activate its target again (a `rollback` change record)."""
    access.require(approver, access.APPROVE, request.workspace)
    if approver.pk == request.requested_by_id:
        raise RollbackRequestError(
            "a rollback must be approved by someone other than its requester", code="four_eyes"
        )
    return _activate(
        version=request.target, actor=approver, rollback_request=request, comment=comment
    )


def rollback_request_reject(
    *, request: RollbackRequest, approver: User, comment: str
) -> RollbackRequest:
    """Close a pending rollback request without activating anything."""
    access.require(approver, access.APPROVE, request.workspace)
    if approver.pk == request.requested_by_id:
        raise RollbackRequestError(
            "a rollback must be decided by someone other than its requester", code="four_eyes"
        )
    if not comment.strip():
        raise RollbackRequestError("a rejection needs a comment saying why", field="comment")
    with transaction.atomic():
        locked = _lock_pending_request(request)
        locked.status = RollbackRequest.Status.REJECTED
        locked.decided_by = approver
        locked.decided_at = timezone.now()
        locked.comment = comment
        locked.save(update_fields=["status", "decided_by", "decided_at", "comment"])
    return locked


def _lock_pending_request(request: RollbackRequest) -> RollbackRequest:
    locked = RollbackRequest.objects.select_for_update().get(pk=request.pk)
    if locked.status != RollbackRequest.Status.PENDING:
        raise RollbackRequestError(
            f"the rollback request is already {locked.status}", code="conflict"
        )
    return locked


def _activate(
    *,
    version: ProfileVersion,
    actor: User,
    rollback_request: RollbackRequest | None,
    comment: str = "",
) -> ProfileChangeRecord:
    registered = False
    try:
        with transaction.atomic():
            workspace = Workspace.objects.select_for_update().get(pk=version.workspace_id)
            version = ProfileVersion.objects.select_related("workspace").get(pk=version.pk)
            approval = selectors.profile_version_approval(version=version)
            if approval is None or approval.decision != ProfileApproval.Decision.APPROVE:
                state = "rejected" if approval is not None else "not approved yet"
                raise ProfileNotApproved(f"{version} is {state}; only approved versions activate")
            current = selectors.workspace_current_version(workspace=workspace)
            if current is not None and current.pk == version.pk:
                raise ProfileActivationConflict(f"{version} is already the current version")
            if rollback_request is None:
                if selectors.profile_version_was_activated(version=version):
                    raise ProfileActivationConflict(
                        f"{version} was active before; request a rollback to activate it again"
                    )
            else:
                rollback_request = _lock_pending_request(rollback_request)

            try:
                core_record = runtime.register_activation(version)
            except ProfileConflictError as error:
                raise ProfileActivationConflict(str(error)) from error
            registered = True
            expected_previous = current.profile_version if current is not None else None
            if core_record is None or core_record.previous_profile_version != expected_previous:
                raise ProfileActivationConflict(
                    f"this process's registry disagrees with the ledger about {workspace.key}; "
                    "it is rebuilt from the ledger, try again"
                )
            record = ProfileChangeRecord.objects.create(
                workspace=workspace,
                kind=core_record.kind,
                version=version,
                previous_version=current,
                previous_profile_version=core_record.previous_profile_version,
                profile_version=core_record.profile_version,
                digest=core_record.digest,
                profile_digest=core_record.profile_digest,
                at=dt.datetime.fromtimestamp(core_record.at_epoch_ms / 1000, tz=dt.UTC),
                at_epoch_ms=core_record.at_epoch_ms,
                actor=actor,
                approval=approval,
                rollback_request=rollback_request,
            )
            if rollback_request is not None:
                rollback_request.status = RollbackRequest.Status.APPROVED
                rollback_request.decided_by = actor
                rollback_request.decided_at = record.at
                rollback_request.comment = comment
                rollback_request.save(
                    update_fields=["status", "decided_by", "decided_at", "comment"]
                )
            _notify(workspace)
            runtime.mark_applied(workspace.key, record.pk)
    except BaseException:
        if registered:
            # The registry moved but the ledger did not: rebuild it from the ledger on next use.
            runtime.reset_registry()
        raise
    return record


def _notify(workspace: Workspace) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # Delivered at commit, so listeners never see an activation that rolled back.
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, workspace.key])
