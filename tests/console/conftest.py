"""The admission layer's users, workspaces and documents, for the interface tests here."""

from __future__ import annotations

from tests.admission.conftest import (  # noqa: F401 (fixtures and the PostgreSQL marker's hook)
    _fast_password_hashing,
    _fresh_registry,
    approved,
    approver,
    make_document,
    make_user,
    manifest_profile,
    member,
    other_workspace,
    outsider,
    proposer,
    pytest_runtest_setup,
    seed_history,
    workspace,
)
