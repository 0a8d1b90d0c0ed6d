"""Finding 7: the demo accounts are created once with random passwords and never reset; every
run issues working API tokens."""

from __future__ import annotations

import dataclasses

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from admission.models import WorkspaceMembership
from config.demo import (
    APPROVER,
    CREDENTIALS_FILE,
    FIXED_PASSWORDS,
    PROPOSER,
    DemoUser,
    credentials_file_read,
    credentials_file_save,
    demo_setup,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_first_run_creates_accounts_with_random_passwords_shown_once():
    demo = demo_setup()
    assert demo.profile_version == "demo-v1"
    users = get_user_model().objects
    for shown in (demo.proposer, demo.approver):
        assert shown.password is not None
        assert shown.password not in FIXED_PASSWORDS.values() and len(shown.password) >= 16
        assert users.get(username=shown.username).check_password(shown.password)
        assert _api(shown.token).get("/api/workspaces/demo/profiles/").status_code == 200
    assert demo.proposer.password != demo.approver.password
    again = demo_setup()
    assert again.proposer.password is None and again.approver.password is None
    assert again.proposer.token != demo.proposer.token
    assert _api(again.proposer.token).get("/api/workspaces/demo/").status_code == 200


def test_later_runs_restore_nothing_an_operator_changed():
    demo_setup()
    proposer = get_user_model().objects.get(username=PROPOSER)
    proposer.set_password("an-operator-chose-this")
    proposer.is_staff = False
    proposer.save()
    WorkspaceMembership.objects.filter(user=proposer).delete()
    approver_role = WorkspaceMembership.objects.filter(user__username=APPROVER)
    approver_role.update(role=WorkspaceMembership.Role.VIEWER)

    demo = demo_setup()

    proposer.refresh_from_db()
    assert proposer.check_password("an-operator-chose-this")
    assert proposer.is_staff is False
    assert not WorkspaceMembership.objects.filter(user=proposer).exists()
    assert approver_role.get().role == WorkspaceMembership.Role.VIEWER
    # The token still signs the proposer in, and grants nothing the roles do not.
    assert _api(demo.proposer.token).get("/api/workspaces/demo/").status_code == 404


def test_fixed_passwords_only_when_asked_for(settings):
    settings.SLUICE_DEMO_FIXED_PASSWORDS = True
    demo = demo_setup()
    assert demo.proposer.password == FIXED_PASSWORDS[PROPOSER]
    assert demo.approver.password == FIXED_PASSWORDS[APPROVER]


def test_created_passwords_are_kept_in_an_owner_only_file(tmp_path):
    demo = demo_setup()
    path = credentials_file_save(demo, tmp_path / "var")
    assert path == tmp_path / "var" / CREDENTIALS_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    kept = credentials_file_read(path)
    assert kept == {PROPOSER: demo.proposer.password, APPROVER: demo.approver.password}
    users = get_user_model().objects
    assert all(users.get(username=name).check_password(kept[name]) for name in kept)
    # A later run creates nothing: the file is named, not rewritten.
    path.chmod(0o644)
    assert credentials_file_save(demo_setup(), tmp_path / "var") == path
    assert credentials_file_read(path) == kept
    # An account made again (its row was removed) replaces its own line only, owner-only again.
    later = demo_setup()
    again = dataclasses.replace(later, approver=DemoUser(APPROVER, "made-again", "t"))
    credentials_file_save(again, tmp_path / "var")
    assert credentials_file_read(path) == kept | {APPROVER: "made-again"}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == [CREDENTIALS_FILE]


def test_no_file_is_named_when_the_accounts_predate_it(tmp_path):
    demo_setup()
    assert credentials_file_save(demo_setup(), tmp_path) is None
    assert not (tmp_path / CREDENTIALS_FILE).exists()
