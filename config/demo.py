"""The demo deployment `make run` sets up: one workspace, a proposer and an approver, an active
profile that went through propose → approve → activate, and API tokens. Idempotent."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from rest_framework.authtoken.models import Token

from admission import selectors, services
from admission.models import Workspace

WORKSPACE_KEY = "demo"
PROPOSER = "demo-proposer"
APPROVER = "demo-approver"
# Demo-only credentials for a server bound to 127.0.0.1; printed by `make run`.
PASSWORDS = {PROPOSER: "proposer-demo-pass", APPROVER: "approver-demo-pass"}

PERMISSIONS = {
    "admission": (
        "add_profileversion",
        "view_profileversion",
        "approve_profileversion",
        "activate_profileversion",
        "view_profileapproval",
        "view_profilechangerecord",
        "add_rollbackrequest",
        "view_rollbackrequest",
        "view_workspace",
    ),
    "evaluator": (
        "add_evaluationrun",
        "view_evaluationrun",
        "add_loadrun",
        "view_loadrun",
        "view_receipt",
    ),
}

_PRINCIPAL_LIMITS = {
    "concurrency": 2,
    "requestsPerMinute": 3000,
    "maxQueueLength": 128,
    "maxQueueWaitMs": 30000,
}
DEMO_PROFILE: dict[str, Any] = {
    "profileVersion": "demo-v1",
    "workspace": {
        "concurrency": 4,
        "requestsPerMinute": 6000,
        "maxQueueLength": 256,
        "maxQueueWaitMs": 30000,
    },
    "providers": {
        "fake": {
            "concurrency": 4,
            "requestsPerMinute": 6000,
            "maxQueueLength": 256,
            "maxQueueWaitMs": 30000,
            "circuitBreaker": {"failureThreshold": 5, "openMs": 1000, "halfOpenMaxCalls": 1},
        }
    },
    "principals": {PROPOSER: dict(_PRINCIPAL_LIMITS), APPROVER: dict(_PRINCIPAL_LIMITS)},
}


def demo_profile(label: str = "demo-v1", **workspace_limits: Any) -> dict[str, Any]:
    """The demo profile under another label, with some workspace limits changed."""
    document = copy.deepcopy(DEMO_PROFILE)
    document["profileVersion"] = label
    document["workspace"].update(workspace_limits)
    return document


@dataclass(frozen=True)
class DemoUser:
    username: str
    password: str
    token: str


@dataclass(frozen=True)
class Demo:
    workspace: str
    profile_version: str
    proposer: DemoUser
    approver: DemoUser

    def as_dict(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace,
            "profileVersion": self.profile_version,
            "users": [
                {"username": u.username, "password": u.password, "token": u.token}
                for u in (self.proposer, self.approver)
            ],
        }


def demo_setup() -> Demo:
    """Create (or find) the demo workspace, users, tokens and active profile."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # WAL lets the web server read while the worker writes; it sticks to the file.
            cursor.execute("PRAGMA journal_mode=WAL")
    with transaction.atomic():
        workspace, _ = Workspace.objects.get_or_create(
            key=WORKSPACE_KEY, defaults={"name": "Demo workspace"}
        )
        users = {name: _user(name) for name in (PROPOSER, APPROVER)}
        workspace.members.add(*users.values())
    current = selectors.workspace_current_version(workspace=workspace)
    if current is None:
        current = _activate_demo_profile(workspace, users[PROPOSER], users[APPROVER])
    return Demo(
        workspace=workspace.key,
        profile_version=current.profile_version,
        proposer=_demo_user(users[PROPOSER]),
        approver=_demo_user(users[APPROVER]),
    )


def _user(username: str) -> Any:
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username, defaults={"is_staff": True})
    if created or not user.check_password(PASSWORDS[username]) or not user.is_staff:
        user.is_staff = True
        user.set_password(PASSWORDS[username])
        user.save()
    for app_label, codenames in PERMISSIONS.items():
        user.user_permissions.add(
            *Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames)
        )
    return user


def _demo_user(user: Any) -> DemoUser:
    token, _ = Token.objects.get_or_create(user=user)
    return DemoUser(user.username, PASSWORDS[user.username], token.key)


def _activate_demo_profile(workspace: Workspace, proposer: Any, approver: Any) -> Any:
    label = DEMO_PROFILE["profileVersion"]
    version = selectors.profile_version_get(workspace=workspace, label=label)
    if version is None:
        version = services.profile_version_propose(
            workspace=workspace, document=DEMO_PROFILE, proposed_by=proposer
        )
    if selectors.profile_version_approval(version=version) is None:
        services.profile_version_approve(
            version=version,
            approver=approver,
            checklist={key: True for key, _ in services.RUNBOOK_CHECKLIST},
            comment="Demo profile set up by `make run`.",
        )
    services.profile_version_activate(version=version, actor=approver)
    return version
