"""`manage.py profiles`: the whole workflow from a shell, and a CommandError for bad input."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from knox.models import AuthToken

from admission.models import ProfileChangeRecord, ProfileVersion
from admission.services import profiles as services

pytestmark = pytest.mark.django_db


def _profiles(*args: str) -> str:
    """Run the command as `--user`, proving it with that test user's password."""
    out = io.StringIO()
    user = args[args.index("--user") + 1] if "--user" in args else ""
    with mock.patch.dict(os.environ, {"SLUICE_PROFILES_PASSWORD": f"{user}-password"}):
        call_command("profiles", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def document_file(tmp_path: Path, make_document: Any) -> Any:
    def write(label: str, *, concurrency: int | None = None) -> str:
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(make_document(label, concurrency=concurrency)))
        return str(path)

    return write


def test_CNC_ADMIT_AUDIT_command_workflow_from_proposal_to_rollback(
    workspace, proposer, approver, document_file
):
    ws = ("--workspace", "acme")
    assert "Proposed acme:v1" in _profiles(
        "propose", *ws, "--file", document_file("v1"), "--user", "pat"
    )
    _profiles("approve", *ws, "--version", "v1", "--user", "alex", "--confirm-all")
    assert "initial" in _profiles("activate", *ws, "--version", "v1", "--user", "alex")
    _profiles("propose", *ws, "--file", document_file("v2", concurrency=2), "--user", "pat")
    confirms = [
        arg
        for key in (
            "capacity-documented",
            "diff-reviewed",
            "offline-manifest-passed",
            "rollback-target-known",
            "reservations-fit",
        )
        for arg in ("--confirm", key)
    ]
    _profiles("approve", *ws, "--version", "v2", "--user", "alex", *confirms)
    assert "change" in _profiles("activate", *ws, "--version", "v2", "--user", "pat")
    _profiles("rollback", "request", *ws, "--version", "v1", "--user", "pat", "--reason", "slow")
    assert "rollback" in _profiles("rollback", "approve", *ws, "--user", "alex")

    listing = _profiles("list", *ws, "--user", "pat")
    assert "v1\tactive" in listing and "v2\tsuperseded" in listing
    history = [
        json.loads(line)
        for line in _profiles("history", *ws, "--user", "pat", "--json").splitlines()
    ]
    assert [r["kind"] for r in history] == ["initial", "change", "rollback"]
    assert history == [r.to_dict() for r in ProfileChangeRecord.objects.order_by("id")]
    rollback = _profiles("history", *ws, "--user", "pat", "--kind", "rollback")
    assert rollback.count("\n") == 1
    assert rollback.rstrip("\n").endswith("\tslow")


def test_reject_and_rollback_reject(workspace, proposer, approver, approved, document_file):
    ws = ("--workspace", "acme")
    _profiles("propose", *ws, "--file", document_file("v9"), "--user", "pat")
    assert "Rejected acme:v9" in _profiles(
        "reject", *ws, "--version", "v9", "--user", "alex", "--comment", "too wide"
    )
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    _profiles("rollback", "request", *ws, "--version", "v1", "--user", "pat")
    assert "Rejected the rollback" in _profiles(
        "rollback", "reject", *ws, "--user", "alex", "--comment", "not now"
    )


def test_proposing_the_same_file_twice_says_so(workspace, proposer, document_file):
    path = document_file("v1")
    _profiles("propose", "--workspace", "acme", "--file", path, "--user", "pat")
    again = _profiles("propose", "--workspace", "acme", "--file", path, "--user", "pat")
    assert "already proposed" in again
    assert ProfileVersion.objects.count() == 1


@pytest.fixture
def bad_files(tmp_path: Path, make_document: Any) -> dict[str, str]:
    invalid = make_document("bad")
    invalid["providers"]["jev"]["concurrency"] = "three"
    files = {
        "not-json": "{profileVersion: v1",
        "invalid": json.dumps(invalid),
        "array": "[1, 2]",
    }
    paths = {}
    for name, text in files.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        paths[name] = str(path)
    return paths


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["propose", "--workspace", "acme", "--file", "/nonexistent.json", "--user", "pat"],
            "no such file",
        ),
        (
            ["propose", "--workspace", "acme", "--file", "{not-json}", "--user", "pat"],
            "not valid JSON",
        ),
        (
            ["propose", "--workspace", "acme", "--file", "{invalid}", "--user", "pat"],
            "providers.jev.concurrency",
        ),
        (
            ["propose", "--workspace", "acme", "--file", "{array}", "--user", "pat"],
            "must be an object",
        ),
        (
            ["propose", "--workspace", "nowhere", "--file", "{invalid}", "--user", "pat"],
            "unknown workspace 'nowhere'",
        ),
        (
            ["propose", "--workspace", "acme", "--file", "{invalid}", "--user", "nobody"],
            "could not verify that you are nobody",
        ),
        (
            ["approve", "--workspace", "acme", "--version", "v404", "--user", "alex"],
            "no profile version 'v404'",
        ),
        (
            [
                "approve",
                "--workspace",
                "acme",
                "--version",
                "v1",
                "--user",
                "alex",
                "--confirm",
                "vibes",
            ],
            "unknown checklist item(s) vibes",
        ),
        (
            ["approve", "--workspace", "acme", "--version", "v1", "--user", "alex"],
            "checklist item confirmed",
        ),
        (
            ["approve", "--workspace", "acme", "--version", "v1", "--user", "pat", "--confirm-all"],
            "second person",
        ),
        (
            ["activate", "--workspace", "acme", "--version", "v1", "--user", "alex"],
            "not approved yet",
        ),
        (["reject", "--workspace", "acme", "--version", "v1", "--user", "alex"], "--comment"),
        (["rollback", "approve", "--workspace", "acme", "--user", "alex"], "no pending rollback"),
        (
            ["rollback", "request", "--workspace", "acme", "--version", "v1", "--user", "alex"],
            "never active",
        ),
        (["history"], "--workspace"),
        (["fly"], "invalid choice"),
    ],
)
def test_bad_input_is_a_command_error(
    workspace, proposer, approver, make_document, bad_files, args, message
):
    services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    args = [bad_files[arg[1:-1]] if arg.startswith("{") else arg for arg in args]
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _profiles(*args)


def test_activation_conflict_is_a_command_error(workspace, approver, approved):
    approved("v1")
    _profiles("activate", "--workspace", "acme", "--version", "v1", "--user", "alex")
    with pytest.raises(CommandError, match="already the current version"):
        _profiles("activate", "--workspace", "acme", "--version", "v1", "--user", "alex")


def test_rollout_controls_from_the_shell(workspace, proposer, approver, approved, member):
    from admission.models import RolloutEvent
    from admission.services import rollout

    current = approved("v1")
    approved("v2", concurrency=2)
    services.profile_version_activate(version=current, actor=approver)
    ws = ("--workspace", "acme")
    with pytest.raises(CommandError, match="needs a reason"):
        _profiles("switch", *ws, "--off", "--user", "pat")
    assert "off: runs that start from now on are serial" in _profiles(
        "switch", *ws, "--off", "--reason", "incident 42", "--user", "pat"
    )
    assert not rollout.parallel_scheduling_allowed(workspace=workspace)
    with pytest.raises(CommandError, match="already off"):
        _profiles("switch", *ws, "--off", "--reason", "again", "--user", "alex")
    _profiles("switch", *ws, "--on", "--user", "alex")

    assert "Started acme:v2 as the shadow" in _profiles(
        "shadow", "start", *ws, "--version", "v2", "--user", "pat"
    )
    shown = _profiles("shadow", "show", *ws, "--user", "alex")
    assert "shadow v2 since" in shown and "0 run(s) observed" in shown
    assert "Requests rejected" in shown
    as_json = json.loads(_profiles("shadow", "show", *ws, "--json", "--user", "alex"))
    assert as_json["observations"] == 0 and as_json["passed"] is False
    _profiles("shadow", "stop", *ws, "--reason", "done", "--user", "alex")
    with pytest.raises(CommandError, match="no running shadow"):
        _profiles("shadow", "show", *ws, "--user", "alex")

    with pytest.raises(CommandError, match="above 0 and below 1"):
        _profiles("canary", "start", *ws, "--version", "v2", "--fraction", "2", "--user", "pat")
    _profiles("canary", "start", *ws, "--version", "v2", "--principal", "quiet-1", "--user", "pat")
    assert "change" in _profiles("canary", "promote", *ws, "--user", "alex")
    # A proposer may read but not switch.
    with pytest.raises(CommandError, match="mia: you may not turn the kill switch"):
        _profiles("switch", *ws, "--off", "--reason", "x", "--user", "mia")
    kinds = list(RolloutEvent.objects.order_by("id").values_list("kind", flat=True))
    assert kinds == [
        "parallel-off",
        "parallel-on",
        "shadow-start",
        "shadow-stop",
        "canary-start",
        "canary-promote",
    ]


def test_wrong_shell_passwords_count_toward_the_sign_in_lockout(proposer, workspace, settings):
    wrong = {"SLUICE_PROFILES_PASSWORD": "wrong-password"}
    args = ("history", "--workspace", "acme", "--user", "pat")
    for attempt in range(1, settings.AXES_FAILURE_LIMIT + 1):
        said = "locked out" if attempt == settings.AXES_FAILURE_LIMIT else "wrong or expired"
        with mock.patch.dict(os.environ, wrong), pytest.raises(CommandError, match=said):
            call_command("profiles", *args, stdout=io.StringIO())
    # Locked out: the right password is refused too, here and at the admin's sign-in.
    with pytest.raises(CommandError, match="locked out after too many failed sign-ins"):
        _profiles(*args)
    login = Client().post("/admin/login/", {"username": "pat", "password": "pat-password"})
    assert login.status_code == 429
    # An API token still proves who the user is: the lockout guards passwords.
    _, token = AuthToken.objects.create(user=proposer)
    with mock.patch.dict(os.environ, {"SLUICE_PROFILES_TOKEN": token}):
        call_command("profiles", *args, stdout=io.StringIO())


def test_a_right_shell_password_resets_the_failure_count(proposer, workspace, settings):
    wrong = {"SLUICE_PROFILES_PASSWORD": "wrong-password"}
    args = ("history", "--workspace", "acme", "--user", "pat")
    for _ in range(2):
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            with mock.patch.dict(os.environ, wrong), pytest.raises(CommandError):
                call_command("profiles", *args, stdout=io.StringIO())
        _profiles(*args)
