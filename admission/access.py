"""Who may do what in which workspace: the one rule the admin, the API, the services and the
shell all ask.

A user acts on a workspace only through a membership of it (`WorkspaceMembership`), and the
membership's role grants a fixed set of acts. Roles form a ladder, each adding to the one below:

    viewer    view                 read the workspace: profiles, decisions, history, runs
    member    + evaluate           submit evaluations, as the admission principal
    proposer  + propose            propose profile versions
    approver  + approve            approve or reject versions and rollback requests
    operator  + activate, run-load activate versions, request rollbacks, start load runs,
              + operate          turn the kill switch, start and stop shadows and canaries
              + cancel-runs      cancel anybody's evaluation runs (members cancel their own)

Nothing is global: neither staff status, Django's model permissions nor superuser status grants
an act on a workspace. Superusers administer workspaces and memberships in the admin (recorded
in its change log); to act in a workspace they take a membership like anybody else. Four-eyes
rules (approver ≠ proposer, rollback decider ≠ requester) hold on top of the roles.

Public API: `can`, `require`, `workspaces_for`, `acts_of`, `AccessDenied` and the act names.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from admission.models import Workspace, WorkspaceMembership

__all__ = [
    "ACTIVATE",
    "ACTS",
    "APPROVE",
    "CANCEL_RUNS",
    "EVALUATE",
    "OPERATE",
    "PROPOSE",
    "ROLE_ACTS",
    "RUN_LOAD",
    "VIEW",
    "AccessDenied",
    "acts_of",
    "can",
    "require",
    "roles_granting",
    "workspaces_for",
]

VIEW = "view"
EVALUATE = "evaluate"
PROPOSE = "propose"
APPROVE = "approve"
ACTIVATE = "activate"
RUN_LOAD = "run-load"
OPERATE = "operate"
CANCEL_RUNS = "cancel-runs"

# What each act lets a user do, as the refusal says it.
ACTS: dict[str, str] = {
    VIEW: "see",
    EVALUATE: "submit evaluations in",
    PROPOSE: "propose profile versions in",
    APPROVE: "approve or reject changes in",
    ACTIVATE: "activate profile versions or request rollbacks in",
    RUN_LOAD: "start load runs in",
    OPERATE: "turn the kill switch or start and stop shadows and canaries in",
    CANCEL_RUNS: "cancel others' evaluation runs in",
}

_Role = WorkspaceMembership.Role
ROLE_ACTS: dict[str, frozenset[str]] = {
    _Role.VIEWER: frozenset({VIEW}),
    _Role.MEMBER: frozenset({VIEW, EVALUATE}),
    _Role.PROPOSER: frozenset({VIEW, EVALUATE, PROPOSE}),
    _Role.APPROVER: frozenset({VIEW, EVALUATE, PROPOSE, APPROVE}),
    _Role.OPERATOR: frozenset(
        {VIEW, EVALUATE, PROPOSE, APPROVE, ACTIVATE, RUN_LOAD, OPERATE, CANCEL_RUNS}
    ),
}


class AccessDenied(PermissionDenied):
    """`user` may not do `act` in `workspace`; the API answers 403, the admin and the shell
    report the message."""

    def __init__(self, act: str, workspace: Workspace | str) -> None:
        key = workspace if isinstance(workspace, str) else workspace.key
        super().__init__(f"you may not {ACTS[act]} workspace {key}")
        self.act = act
        self.workspace_key = key


def roles_granting(act: str) -> list[str]:
    """The roles whose members may do `act` (a `KeyError` for an unknown act)."""
    if act not in ACTS:
        raise KeyError(f"unknown act {act!r}")
    return [role for role, acts in ROLE_ACTS.items() if act in acts]


def workspaces_for(user: Any, act: str) -> QuerySet[Workspace]:
    """The workspaces where `user` may do `act` (none for anonymous or inactive users)."""
    roles = roles_granting(act)
    if not _acting(user):
        return Workspace.objects.none()
    return Workspace.objects.filter(
        pk__in=WorkspaceMembership.objects.filter(user=user, role__in=roles).values("workspace_id")
    )


def can(user: Any, act: str, workspace: Workspace) -> bool:
    """Whether `user` may do `act` in `workspace`."""
    roles = roles_granting(act)
    if not _acting(user):
        return False
    return WorkspaceMembership.objects.filter(
        user=user, workspace=workspace, role__in=roles
    ).exists()


def require(user: Any, act: str, workspace: Workspace) -> None:
    """Raise `AccessDenied` unless `user` may do `act` in `workspace`."""
    if not can(user, act, workspace):
        raise AccessDenied(act, workspace)


def acts_of(user: Any, workspace: Workspace) -> frozenset[str]:
    """Everything `user` may do in `workspace` (empty for a non-member)."""
    if not _acting(user):
        return frozenset()
    role = (
        WorkspaceMembership.objects.filter(user=user, workspace=workspace)
        .values_list("role", flat=True)
        .first()
    )
    return ROLE_ACTS.get(role, frozenset()) if role is not None else frozenset()


def _acting(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)
