"""What an approver gets before signing: what-if runs beside the version, the limits diff with
omitted and zero limits spelled out, and the rest of the operator's pages around them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import CommandError, call_command
from django.test import Client

from admission.models import ProfileChangeRecord, RollbackRequest, WorkspaceMembership
from admission.services import profiles as services
from evaluator.harness.records import FLAG_OFFLINE_PASSED, FLAG_QUALIFIED, evidence_flags
from evaluator.models import LoadRun
from evaluator.services.runs import InvalidRunRequest, load_run_submit
from evaluator.worker.load_dispatch import load_run_execute

pytestmark = pytest.mark.django_db

VERSIONS_URL = "/admin/admission/profileversion/"


def _login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _act(client: Client, action: str, objects: list[Any], **extra: Any) -> Any:
    data = {"action": action, ACTION_CHECKBOX_NAME: [obj.pk for obj in objects], **extra}
    return client.post(VERSIONS_URL, data, follow=True)


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.fixture
def load_runner(approver: Any, workspace: Any, proposer: Any, monkeypatch: Any) -> Any:
    """alex, an operator, may start load runs and what-if runs; pat, only an approver here,
    may start what-if runs, not load runs. The shell proves alex's identity with his password."""
    WorkspaceMembership.objects.filter(workspace=workspace, user=proposer).update(role="approver")
    monkeypatch.setenv("SLUICE_PROFILES_PASSWORD", "alex-password")
    return approver


def _tight(make_document: Any, label: str) -> dict[str, Any]:
    document = make_document(label)
    for entry in document["principals"]:
        if entry["class"] == "quiet":
            entry["limits"]["requestsPerMinute"] = 30
    return document


def test_what_if_action_runs_beside_the_version_and_the_approval_page_shows_it(
    workspace, proposer, load_runner, approved, make_document
):
    services.profile_version_activate(version=approved("v1"), actor=load_runner)
    v2 = services.profile_version_propose(
        workspace=workspace, document=_tight(make_document, "v2"), proposed_by=proposer
    )
    client = _login(load_runner)
    form = _act(client, "run_what_if", [v2])
    assert form.context["form"].fields["manifest"].choices == [
        ("load-manifest.v2.json", "load-manifest.v2.json")
    ]
    started = _act(
        client,
        "run_what_if",
        [v2],
        post="yes",
        manifest="load-manifest.v2.json",
        target="admission-controller",
    )
    assert _messages(started) == [
        "Started a what-if run of acme:v2 (load-manifest.v2.json → admission-controller)."
    ]
    run = LoadRun.objects.get()
    assert (run.what_if_version, run.status, run.submitted_by) == (v2, "queued", load_runner)

    # What the worker's task does with it.
    done = load_run_execute(run.pk)
    assert done.status == "completed" and done.passed is False
    assert done.record["mode"] == "what-if"
    assert done.record["whatIf"]["profileDigest"] == v2.profile_digest
    assert evidence_flags([done.record]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: False}

    page = _act(client, "approve_selected", [v2])
    html = page.content.decode()
    assert "FAILS" in html
    # The what-if record: its charts, and figures rounded for reading; the record keeps them.
    section = html[html.index('class="what-if-runs"') :]
    assert section.count("<svg") >= 2
    assert not re.search(r"\d\.\d{5,}", section), re.findall(r"\d\.\d{5,}", section)
    whole = [c["observed"] for c in done.record["comparisons"] if isinstance(c["observed"], float)]
    assert any(len(repr(value).split(".")[-1]) > 4 for value in whole)
    assert "minimumQuietPrincipalAdmissionRatio" in html
    # The limits diff against the current version v1, field by field.
    rows = page.context["reviews"][0][0].limits
    assert {(row.scope, row.field, row.current, row.proposed) for row in rows} == {
        (f"principals.{name}", "requestsPerMinute", "600", "30")
        for name in ("quiet-reserved", "quiet-a", "quiet-b", "quiet-c")
    }
    assert "Against the current version <strong>v1</strong>" in html


def test_the_approval_page_flags_a_zero_limit_and_says_when_no_what_if_ran(
    workspace, proposer, approver, make_document
):
    document = make_document("v1")
    document["workspace"]["maxQueueLength"] = 0
    version = services.profile_version_propose(
        workspace=workspace, document=document, proposed_by=proposer
    )
    html = _act(_login(approver), "approve_selected", [version]).content.decode()
    assert "1 zero limit: a zero admits nothing of its kind" in html
    assert "lets nothing wait" in html
    assert "No what-if run yet" in html


def test_a_passing_what_if_from_the_shell_is_kept_and_printed(
    workspace, proposer, load_runner, make_document, capsys
):
    services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    call_command(
        "profiles",
        "what-if",
        "v1",
        "--workspace",
        "acme",
        "--user",
        "alex",
        "--target",
        "evaluator",
    )
    out = capsys.readouterr().out
    assert "What-if acme:v1 on load-manifest.v2.json → evaluator: passes every bound" in out
    assert "noisy → noisy" in out
    run = LoadRun.objects.get()
    assert run.passed is True and run.record["mode"] == "what-if"


def test_what_if_command_errors_are_typed(
    workspace, proposer, load_runner, make_document, monkeypatch
):
    services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    base = ["profiles", "what-if", "v1", "--workspace", "acme"]
    with pytest.raises(CommandError, match=r"mapping\.principals\.nobody"):
        call_command(*base, "--user", "alex", "--map-principal", "nobody=noisy")
    with pytest.raises(CommandError, match="MANIFEST_ID=PROFILE_ID"):
        call_command(*base, "--user", "alex", "--map-provider", "jev")
    # A what-if run qualifies a proposal: a member who may not propose may not ask for one.
    WorkspaceMembership.objects.filter(workspace=workspace, user=proposer).update(role="member")
    monkeypatch.setenv("SLUICE_PROFILES_PASSWORD", "pat-password")
    with pytest.raises(CommandError, match="you may not start what-if runs in workspace acme"):
        call_command(*base, "--user", "pat")
    monkeypatch.setenv("SLUICE_PROFILES_PASSWORD", "alex-password")
    with pytest.raises(CommandError, match="no profile version 'v9'"):
        call_command("profiles", "what-if", "v9", "--workspace", "acme", "--user", "alex")
    assert not LoadRun.objects.exists()


@pytest.mark.parametrize(
    ("elsewhere", "manifest", "target", "field"),
    [
        (True, "load-manifest.v2.json", "evaluator", "version"),
        (False, "load-manifest.v2.json", "staged-provider", "target"),
        (False, "load-manifest.v1.json", "evaluator", "manifest"),
    ],
)
def test_a_what_if_needs_a_version_of_the_same_workspace_and_an_offline_target(
    workspace,
    other_workspace,
    proposer,
    load_runner,
    make_document,
    elsewhere,
    manifest,
    target,
    field,
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    # The operator may run load in both workspaces: what refuses is the version's workspace.
    other_workspace.members.add(load_runner, through_defaults={"role": "operator"})
    with pytest.raises(InvalidRunRequest) as refused:
        load_run_submit(
            other_workspace if elsewhere else workspace,
            load_runner,
            manifest,
            target,
            what_if_version=version,
        )
    assert refused.value.field == field
    assert not LoadRun.objects.exists()


def test_the_what_if_form_reports_a_bad_mapping_on_the_page(
    workspace, proposer, load_runner, make_document
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    client = _login(load_runner)
    extra = {"post": "yes", "manifest": "load-manifest.v2.json", "target": "evaluator"}
    broken = _act(client, "run_what_if", [version], mapping="{not json", **extra)
    assert "not valid JSON" in str(broken.context["form"].errors["mapping"])
    refused = _act(
        client, "run_what_if", [version], mapping='{"providers": {"jev": "nope"}}', **extra
    )
    assert _messages(refused) == [
        "Refused: acme:v1: mapping.providers.jev: the profile has no provider 'nope' (it has "
        "jev, llm-subagent)"
    ]
    assert not LoadRun.objects.exists()


def test_the_what_if_action_needs_a_role_that_may_propose(workspace, proposer, load_runner):
    # pat is an approver here (who may also propose): a what-if qualifies a proposal.
    choices = _login(proposer).get(VERSIONS_URL).context["action_form"].fields["action"].choices
    assert "run_what_if" in [name for name, _ in choices]
    WorkspaceMembership.objects.filter(workspace=workspace, user=proposer).update(role="viewer")
    # A viewer is offered no action at all.
    assert _login(proposer).get(VERSIONS_URL).context["action_form"] is None


def test_refusals_do_not_repeat_the_label(workspace, proposer, make_document):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    checks = {f"check_{key}": "on" for key, _ in services.RUNBOOK_CHECKLIST}
    refused = _act(_login(proposer), "approve_selected", [version], post="yes", **checks)
    # Refused before the checklist, once, and the key keeps its case.
    assert _messages(refused) == [
        "Not offered: you proposed acme:v1, so a second person must decide it (four-eyes rule "
        "of RUN-JEV-ADMISSION-v1)."
    ]


def test_the_rollback_request_asks_for_a_reason_that_the_ledger_shows(
    workspace, proposer, approver, approved
):
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    client = _login(proposer)
    blank = _act(client, "request_rollback", [v1], post="yes", reason="   ")
    assert "reason" in blank.context["form"].errors
    assert not RollbackRequest.objects.exists()
    _act(client, "request_rollback", [v1], post="yes", reason="v2 starves the quiet principals")
    request = RollbackRequest.objects.get()
    assert request.reason == "v2 starves the quiet principals"

    services.rollback_request_approve(request=request, approver=approver)
    listing = _login(approver).get("/admin/admission/profilechangerecord/").content.decode()
    assert "v2 starves the quiet principals" in listing
    record = ProfileChangeRecord.objects.get(kind="rollback")
    detail = _login(approver).get(f"/admin/admission/profilechangerecord/{record.pk}/change/")
    assert "v2 starves the quiet principals" in detail.content.decode()


def test_the_propose_form_starts_from_the_current_version(workspace, proposer, approver, approved):
    v1 = approved("v1")
    services.profile_version_activate(version=v1, actor=approver)
    approved("v2", concurrency=2)  # taken, so the next free label is v3
    form = _login(proposer).get("/admin/admission/profileversion/add/").context["form"]
    document = json.loads(form.initial["document"])
    assert document == {**v1.document, "profileVersion": "v3"}
    assert form.initial["workspace"] == workspace


def test_the_workspace_page_shows_its_current_profile(workspace, approver, approved, admin_user):
    client = _login(admin_user)
    assert "none active" in client.get("/admin/admission/workspace/").content.decode()
    services.profile_version_activate(version=approved("v1"), actor=approver)
    listing = client.get("/admin/admission/workspace/").content.decode()
    assert ">v1</a>" in listing
    page = client.get(f"/admin/admission/workspace/{workspace.pk}/change/").content.decode()
    assert "&quot;profileVersion&quot;: &quot;v1&quot;" in page
    assert f"/admin/admission/profileversion/add/?workspace={workspace.pk}" in page
