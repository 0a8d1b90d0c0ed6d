"""The read path for profiles: every query the admin, API and commands need, in one place."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, F, OuterRef, Prefetch, Q, QuerySet, Subquery

from admission import access
from admission.models import (
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    Caller = User | AnonymousUser


def workspace_list_for_user(*, user: Caller, act: str = access.VIEW) -> QuerySet[Workspace]:
    """Workspaces where `user` may do `act` (`admission.access`), with
    `current_profile_version`."""
    current = (
        ProfileChangeRecord.objects.filter(workspace=OuterRef("pk"))
        .order_by("-id")
        .values("profile_version")[:1]
    )
    return (
        access.workspaces_for(user, act)
        .annotate(current_profile_version=Subquery(current))
        .order_by("key")
    )


def workspace_get_for_user(*, user: Caller, key: str, act: str = access.VIEW) -> Workspace | None:
    """One workspace by key where `user` may do `act`, or None (callers answer 404 either way)."""
    return workspace_list_for_user(user=user, act=act).filter(key=key).first()


def workspace_get(*, key: str) -> Workspace | None:
    return Workspace.objects.filter(key=key).first()


def workspace_current_version(*, workspace: Workspace) -> ProfileVersion | None:
    """The version of the latest activation: the ledger's order is activation order."""
    record = (
        ProfileChangeRecord.objects.filter(workspace=workspace)
        .select_related("version__workspace")
        .order_by("-id")
        .first()
    )
    return record.version if record is not None else None


def profile_version_get(*, workspace: Workspace, label: str) -> ProfileVersion | None:
    return (
        ProfileVersion.objects.select_related("workspace", "proposed_by")
        .filter(workspace=workspace, profile_version=label)
        .first()
    )


def profile_version_approval(*, version: ProfileVersion) -> ProfileApproval | None:
    return version.approvals.select_related("approver").first()


def profile_version_was_activated(*, version: ProfileVersion) -> bool:
    return ProfileChangeRecord.objects.filter(version=version).exists()


def profile_version_queryset() -> QuerySet[ProfileVersion]:
    """Versions with decisions prefetched and `was_activated` / `current_version_id` annotated."""
    current = (
        ProfileChangeRecord.objects.filter(workspace=OuterRef("workspace"))
        .order_by("-id")
        .values("version_id")[:1]
    )
    return (
        ProfileVersion.objects.select_related("workspace", "proposed_by")
        .prefetch_related(
            Prefetch(
                "approvals",
                queryset=ProfileApproval.objects.select_related("approver", "proposed_by"),
            )
        )
        .annotate(
            was_activated=Exists(ProfileChangeRecord.objects.filter(version=OuterRef("pk"))),
            current_version_id=Subquery(current),
        )
        .order_by("-created_at", "-id")
    )


def profile_version_list(*, workspace: Workspace) -> QuerySet[ProfileVersion]:
    """One workspace's versions, newest first, annotated as `profile_version_queryset`."""
    return profile_version_queryset().filter(workspace=workspace)


def profile_version_diff_base(*, version: ProfileVersion) -> ProfileVersion | None:
    """The version to compare `version` with: the workspace's current one, unless it is itself."""
    current = workspace_current_version(workspace=version.workspace)
    if current is not None and current.pk == version.pk:
        return None
    return current


def profile_history_list(
    *,
    workspace: Workspace,
    kind: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> QuerySet[ProfileChangeRecord]:
    """Change records of one workspace, newest first, with everything a listing shows joined."""
    records = ProfileChangeRecord.objects.filter(workspace=workspace).select_related(
        "workspace", "actor", "approval__approver", "rollback_request__requested_by"
    )
    if kind:
        records = records.filter(kind=kind)
    if since is not None:
        records = records.filter(at__gte=since)
    if until is not None:
        records = records.filter(at__lte=until)
    return records.order_by("-at", "-id")


def rollback_request_pending(*, workspace: Workspace) -> RollbackRequest | None:
    return (
        RollbackRequest.objects.filter(workspace=workspace, status=RollbackRequest.Status.PENDING)
        .select_related("target__workspace", "requested_by")
        .first()
    )


VERSION_STATUSES = ("proposed", "approved", "rejected", "active", "superseded")


def profile_versions_in_status(
    queryset: QuerySet[ProfileVersion], status: str
) -> QuerySet[ProfileVersion]:
    """The versions of `queryset` (from `profile_version_queryset`) whose `version_status` is
    `status`, decided in the database."""
    current = Q(pk=F("current_version_id"))
    decided = {
        decision: Exists(ProfileApproval.objects.filter(version=OuterRef("pk"), decision=decision))
        for decision in (ProfileApproval.Decision.APPROVE, ProfileApproval.Decision.REJECT)
    }
    if status == "active":
        return queryset.filter(current)
    activated = Exists(ProfileChangeRecord.objects.filter(version=OuterRef("pk")))
    if status == "superseded":
        return queryset.filter(activated).exclude(current)
    undecided = queryset.exclude(activated).exclude(current)
    if status == "approved":
        return undecided.filter(decided[ProfileApproval.Decision.APPROVE])
    if status == "rejected":
        return undecided.filter(decided[ProfileApproval.Decision.REJECT])
    if status == "proposed":
        return undecided.filter(approvals__isnull=True)
    return queryset.none()


def profile_versions_awaiting(
    queryset: QuerySet[ProfileVersion], *, user: Any
) -> QuerySet[ProfileVersion]:
    """Proposed versions that `user` may approve and did not propose (their inbox)."""
    workspaces = access.workspaces_for(user, access.APPROVE)
    return (
        profile_versions_in_status(queryset, "proposed")
        .filter(workspace__in=workspaces)
        .exclude(proposed_by=user)
    )


def version_status(version: ProfileVersion) -> str:
    """A one-word state: proposed, approved, rejected, active or superseded.

    Expects a row from `profile_version_queryset` (annotations and prefetched decisions).
    """
    if version.pk == getattr(version, "current_version_id", None):
        return "active"
    if getattr(version, "was_activated", False):
        return "superseded"
    approvals: list[Any] = list(version.approvals.all())
    if not approvals:
        return "proposed"
    return "approved" if approvals[0].decision == ProfileApproval.Decision.APPROVE else "rejected"
