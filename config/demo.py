"""The demo deployment `make run` sets up: one workspace, a proposer and an approver, an active
profile that went through propose → approve → activate, and API tokens.

Created once and never reset: accounts that exist are left exactly as an operator left them
(password, staff status, roles). Passwords are random per deployment, unless
`SLUICE_DEMO_FIXED_PASSWORDS` asks for the documented ones; the launcher keeps the ones it created
in a file only its owner can read (`credentials_file_save`), since the database holds digests
only. Every run issues each demo user a fresh API token (tokens are stored as digests, so an old
one cannot be shown again).
"""

from __future__ import annotations

import copy
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from knox.models import AuthToken

from admission import access, selectors
from admission.models import ProfileChangeRecord, ProfileVersion, Workspace, WorkspaceMembership
from admission.services import profiles as services

WORKSPACE_KEY = "demo"
PROPOSER = "demo-proposer"
APPROVER = "demo-approver"
# Only with SLUICE_DEMO_FIXED_PASSWORDS, for a server bound to 127.0.0.1.
FIXED_PASSWORDS = {PROPOSER: "proposer-demo-pass", APPROVER: "approver-demo-pass"}
# Under the var dir: the demo accounts' passwords, as created.
CREDENTIALS_FILE = "demo-credentials.txt"

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


def _checked() -> dict[str, bool]:
    """The runbook's checklist, every item confirmed."""
    return {key: True for key, _ in services.RUNBOOK_CHECKLIST}


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
            checklist=_checked(),
            comment="Demo profile set up by `make run`.",
        )
    services.profile_version_activate(version=version, actor=approver)
    return version


def demo_version_approve(document: Mapping[str, Any], *, comment: str = "") -> ProfileVersion:
    """Propose `document` in the demo workspace as the demo's proposer and approve it as its
    approver, every runbook item confirmed (how tests and benchmarks give the demo other
    limits); returns the version, not yet active."""
    users = get_user_model()._default_manager
    version = services.profile_version_propose(
        workspace=Workspace.objects.get(key=WORKSPACE_KEY),
        document=document,
        proposed_by=users.get(username=PROPOSER),
    )
    services.profile_version_approve(
        version=version,
        approver=users.get(username=APPROVER),
        checklist=_checked(),
        comment=comment,
    )
    return version


def demo_version_activate(document: Mapping[str, Any], *, comment: str = "") -> ProfileChangeRecord:
    """`demo_version_approve`, then activate the version as the demo's approver; returns the
    activation's change record."""
    version = demo_version_approve(document, comment=comment)
    approver = get_user_model()._default_manager.get(username=APPROVER)
    return services.profile_version_activate(version=version, actor=approver)


def credentials_file_read(path: Path) -> dict[str, str]:
    """username -> password, from a file `credentials_file_save` wrote (empty when absent)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    found = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            username, _, password = line.strip().partition(" ")
            found[username] = password.strip()
    return found


def credentials_file_save(demo: Demo, var_dir: Path) -> Path | None:
    """Keep the passwords of the accounts this run created in `var_dir`, in a file that only its
    owner can read (mode 0600), beside those of accounts created earlier. Returns the file, or
    None when it does not exist (the accounts were made before such a file was kept)."""
    path = var_dir / CREDENTIALS_FILE
    created = {u.username: u.password for u in (demo.proposer, demo.approver) if u.password}
    if not created:
        return path if path.exists() else None
    passwords = credentials_file_read(path) | created
    lines = [
        "# The demo accounts of this Sluice, as they were created. Sign in at /admin/ with",
        "# a username and its password; `manage.py changepassword NAME` sets a new one (this",
        "# file is not updated then). API tokens: `python -m config.cli demo-setup`.",
        *(f"{username} {password}" for username, password in sorted(passwords.items())),
    ]
    var_dir.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed over: never a half-written file, never readable by others.
    partial = path.with_name(f".{CREDENTIALS_FILE}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(partial, path)
    return path
