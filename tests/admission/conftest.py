"""Fixtures for the admission Django layer: users, a workspace, profile documents, markers."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from admission.models import (
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)
from admission.runtime import registry as runtime
from admission.services import profiles as services

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "load-manifest.v2.json"
PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")
WORKFLOW_PERMISSIONS = (
    "add_profileversion",
    "view_profileversion",
    "approve_profileversion",
    "activate_profileversion",
    "view_profileapproval",
    "view_profilechangerecord",
    "add_rollbackrequest",
    "view_rollbackrequest",
    "view_workspace",
)
ALL_CONFIRMED = {key: True for key, _ in services.RUNBOOK_CHECKLIST}


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://...)")


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Test users need real logins, not costly key stretching.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    # The process registry must not carry revisions of rows that a test's rollback erased.
    runtime.reset_registry()
    yield
    runtime.reset_registry()


@pytest.fixture
def manifest_profile() -> dict[str, Any]:
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return {key: manifest[key] for key in PROFILE_KEYS}


@pytest.fixture
def make_document(manifest_profile: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """A valid profile document; `concurrency` changes the workspace ceiling (and the digest)."""

    def make(label: str, *, concurrency: int | None = None) -> dict[str, Any]:
        document = copy.deepcopy(manifest_profile)
        document["profileVersion"] = label
        if concurrency is not None:
            document["workspace"]["concurrency"] = concurrency
        return document

    return make


def _grant(user: Any, *codenames: str) -> Any:
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="admission", codename__in=codenames)
    )
    return user


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    def make(username: str, *, staff: bool = True, permissions: tuple[str, ...] = ()) -> Any:
        user = django_user_model.objects.create_user(
            username=username, password=f"{username}-password", is_staff=staff
        )
        return _grant(user, *permissions)

    return make


@pytest.fixture
def proposer(make_user: Callable[..., Any]) -> Any:
    return make_user("pat", permissions=WORKFLOW_PERMISSIONS)


@pytest.fixture
def approver(make_user: Callable[..., Any]) -> Any:
    return make_user("alex", permissions=WORKFLOW_PERMISSIONS)


@pytest.fixture
def outsider(make_user: Callable[..., Any]) -> Any:
    return make_user("olga", staff=False, permissions=("add_profileversion",))


@pytest.fixture
def member(make_user: Callable[..., Any], workspace: Workspace) -> Any:
    """A plain (non-staff) proposer of `workspace`; sees its memberships only."""
    user = make_user("mia", staff=False)
    workspace.members.add(user, through_defaults={"role": "proposer"})
    return user


@pytest.fixture
def workspace(proposer: Any, approver: Any) -> Workspace:
    """Acme, where pat and alex are operators (every act; four-eyes still apart)."""
    workspace = Workspace.objects.create(key="acme", name="Acme Corp")
    workspace.members.add(proposer, approver, through_defaults={"role": "operator"})
    return workspace


@pytest.fixture
def other_workspace() -> Workspace:
    return Workspace.objects.create(key="globex", name="Globex Secret Project")


@pytest.fixture
def approved(
    workspace: Workspace, proposer: Any, approver: Any, make_document: Callable[..., Any]
) -> Callable[..., ProfileVersion]:
    """Propose and approve a version in `workspace`."""

    def make(label: str, *, concurrency: int | None = None) -> ProfileVersion:
        version = services.profile_version_propose(
            workspace=workspace,
            document=make_document(label, concurrency=concurrency),
            proposed_by=proposer,
        )
        services.profile_version_approve(
            version=version, approver=approver, checklist=ALL_CONFIRMED, comment="ok"
        )
        return version

    return make


@pytest.fixture
def seed_history(proposer: Any, approver: Any) -> Callable[..., list[Any]]:
    """Insert `count` change records straight into the ledger (no registry), for listings.

    Every third record shares its `at` with the one before, so pages must order by id too.
    """

    def seed(workspace: Workspace, count: int, *, start: dt.datetime | None = None) -> list[Any]:
        start = start or dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
        version = ProfileVersion.objects.create(
            workspace=workspace,
            profile_version=f"seed-{workspace.key}",
            document={},
            digest="sha256:" + "a" * 64,
            profile_digest="sha256:" + "b" * 64,
            proposed_by=proposer,
        )
        approval = ProfileApproval.objects.create(
            version=version, proposed_by=proposer, approver=approver, decision="approve"
        )
        rollback = RollbackRequest.objects.create(
            workspace=workspace,
            target=version,
            requested_by=proposer,
            status=RollbackRequest.Status.APPROVED,
            decided_by=approver,
        )
        rows = []
        for index in range(count):
            kind = ("initial", "change", "rollback")[min(index, 1) + (index % 5 == 4)]
            at = start + dt.timedelta(minutes=index - (1 if index % 3 == 2 else 0))
            rows.append(
                ProfileChangeRecord(
                    workspace=workspace,
                    kind=kind,
                    version=version,
                    previous_version=None if index == 0 else version,
                    previous_profile_version=None if index == 0 else version.profile_version,
                    profile_version=version.profile_version,
                    digest=version.digest,
                    profile_digest=version.profile_digest,
                    at=at,
                    at_epoch_ms=at.timestamp() * 1000,
                    actor=approver,
                    approval=approval,
                    rollback_request=rollback if kind == "rollback" else None,
                )
            )
        return ProfileChangeRecord.objects.bulk_create(rows)

    return seed
