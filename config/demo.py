"""The demo deployment `make run` sets up: one workspace, a proposer and an approver, an active
profile that went through propose → approve → activate, and API tokens.

Created once and never reset: accounts that exist are left exactly as an operator left them
(password, staff status, roles). Passwords are random per deployment and shown once, when the
accounts are created, unless `SLUICE_DEMO_FIXED_PASSWORDS` asks for the documented ones. Every
run issues each demo user a fresh API token (tokens are stored as digests, so an old one cannot
be shown again).
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from knox.models import AuthToken

from admission import access, selectors
from admission.models import Workspace, WorkspaceMembership
from admission.services import profiles as services

WORKSPACE_KEY = "demo"
PROPOSER = "demo-proposer"
APPROVER = "demo-approver"
# Only with SLUICE_DEMO_FIXED_PASSWORDS, for a server bound to 127.0.0.1.
FIXED_PASSWORDS = {PROPOSER: "proposer-demo-pass", APPROVER: "approver-demo-pass"}

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
    # Only when the account was created by this run; None afterwards.
    password: str | None
    token: str


@dataclass(frozen=True)
class Demo:
    workspace: str
    profile_version: str | None
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
    """Create what is missing of the demo (never changing what exists) and issue tokens."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # WAL lets the web server read while the worker writes; it sticks to the file.
            cursor.execute("PRAGMA journal_mode=WAL")
    with transaction.atomic():
        workspace, _ = Workspace.objects.get_or_create(
            key=WORKSPACE_KEY, defaults={"name": "Demo workspace"}
        )
        users: dict[str, Any] = {}
        passwords: dict[str, str | None] = {}
        for name in (PROPOSER, APPROVER):
            users[name], passwords[name] = _user_once(name)
            if passwords[name] is not None:
                # A new account gets its demo role once; a removed role is not given back.
                WorkspaceMembership.objects.get_or_create(
                    workspace=workspace,
                    user=users[name],
                    defaults={"role": WorkspaceMembership.Role.OPERATOR},
                )
    current = selectors.workspace_current_version(workspace=workspace)
    if current is None:
        try:
            current = _activate_demo_profile(workspace, users[PROPOSER], users[APPROVER])
        except access.AccessDenied:
            # An operator took the demo users' roles away; the demo does not take them back.
            current = None
    return Demo(
        workspace=workspace.key,
        profile_version=current.profile_version if current is not None else None,
        proposer=_demo_user(users[PROPOSER], passwords[PROPOSER]),
        approver=_demo_user(users[APPROVER], passwords[APPROVER]),
    )


def _user_once(username: str) -> tuple[Any, str | None]:
    """The user, and its password when this call created it."""
    user_model = get_user_model()
    existing = user_model._default_manager.filter(username=username).first()
    if existing is not None:
        return existing, None
    if settings.SLUICE_DEMO_FIXED_PASSWORDS:
        password = FIXED_PASSWORDS[username]
    else:
        password = secrets.token_urlsafe(12)
    user = user_model._default_manager.create_user(
        username=username, password=password, is_staff=True
    )
    return user, password


def _demo_user(user: Any, password: str | None) -> DemoUser:
    AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()
    _, token = AuthToken.objects.create(user=user)
    return DemoUser(user.username, password, token)


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
