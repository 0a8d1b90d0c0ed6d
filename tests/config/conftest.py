"""The admission layer's users, workspaces and documents, for the deployment-wide tests here."""

from __future__ import annotations

from tests.admission.conftest import (  # noqa: F401 (fixtures)
    _fast_password_hashing,
    _fresh_registry,
    approved,
    approver,
    make_document,
    make_user,
    manifest_profile,
    member,
    other_workspace,
    proposer,
    workspace,
)
