"""Fixtures for the admission Django layer: users, a workspace, profile documents, markers."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from admission import runtime, services
from admission.models import ProfileVersion, Workspace

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
def workspace(proposer: Any, approver: Any) -> Workspace:
    workspace = Workspace.objects.create(key="acme", name="Acme Corp")
    workspace.members.add(proposer, approver)
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
def chromium_path() -> str:
    import os

    path = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
    if not (Path(path).exists() or shutil.which(path)):
        pytest.skip(f"no Chromium at {path}")
    return path
