"""Staged-provider load runs as a deployment configures them (SLUICE_ADAPTERS and
SLUICE_STAGED_PROVIDER), against a real loopback OpenAI-compatible server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from admission.models import Workspace
from evaluator.harness.records import (
    FLAG_QUALIFIED,
    MODE_STAGED,
    evidence_flags,
    verify_record,
)
from evaluator.models import LoadRun
from evaluator.services.runs import InvalidRunRequest, load_run_submit
from evaluator.worker.load_dispatch import load_run_execute
from tests.evaluator.loopback import LoopbackServer, Reply

pytestmark = pytest.mark.django_db

MANIFEST = "load-manifest.v2.json"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        server.default = Reply(content="answered")
        yield server


@pytest.fixture
def staged(settings: Any, server: LoopbackServer) -> Any:
    settings.SLUICE_ADAPTERS = {
        "fake": {"kind": "fake"},
        "staged": {
            "kind": "openai-chat",
            "baseUrl": server.base_url,
            "capacity": {"concurrency": 8, "requestsPerMinute": 6000},
        },
    }
    settings.SLUICE_STAGED_PROVIDER = {"adapter": "staged", "model": "m", "windowSeconds": 1}
    return settings


@pytest.fixture
def workspace() -> Workspace:
    return Workspace.objects.create(key="acme", name="Acme")


@pytest.fixture
def operator(django_user_model: Any, workspace: Workspace) -> Any:
    """An operator of acme: the role that starts load runs."""
    user = django_user_model.objects.create_user("lena", is_staff=True)
    workspace.members.add(user, through_defaults={"role": "operator"})
    return user


def _refusal(workspace: Workspace, operator: Any) -> InvalidRunRequest:
    with pytest.raises(InvalidRunRequest) as refused:
        load_run_submit(workspace, operator, MANIFEST, "staged-provider")
    assert not LoadRun.objects.exists()
    return refused.value


def test_a_staged_run_keeps_a_verified_record_that_qualifies(staged, server, workspace, operator):
    run = load_run_submit(workspace, operator, MANIFEST, "staged-provider")
    done = load_run_execute(run.pk)
    assert done.status == "completed", done.error
    assert done.passed is True
    record = done.record
    verify_record(record, done.manifest_digest)
    assert (record["mode"], record["target"]) == (MODE_STAGED, "staged-provider")
    assert record["window"]["seconds"] == 1
    assert record["observations"]["completed"] == len(server.requests) > 0
    assert evidence_flags([record])[FLAG_QUALIFIED] is True


def test_a_staged_run_against_a_failing_provider_does_not_qualify(
    staged, server, workspace, operator
):
    server.default = Reply(status=503)
    run = load_run_submit(workspace, operator, MANIFEST, "staged-provider")
    done = load_run_execute(run.pk)
    assert done.status == "completed" and done.passed is False
    assert evidence_flags([done.record])[FLAG_QUALIFIED] is False


def test_a_deployment_without_a_staged_provider_refuses_the_run(settings, workspace, operator):
    settings.SLUICE_STAGED_PROVIDER = None
    refusal = _refusal(workspace, operator)
    assert refusal.field == "target"
    assert "SLUICE_STAGED_PROVIDER" in str(refusal)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"adapter": "fake"}, "not an openai-chat adapter"),
        ({"windowSeconds": 3600}, "windowSeconds"),
        ({"model": ""}, "model"),
        ({"region": "eu"}, "region"),
    ],
)
def test_a_misconfigured_staged_provider_is_a_typed_refusal(
    staged, server, workspace, operator, change, message
):
    staged.SLUICE_STAGED_PROVIDER = {**staged.SLUICE_STAGED_PROVIDER, **change}
    refusal = _refusal(workspace, operator)
    assert refusal.field == "target" and message in str(refusal)
    assert server.requests == []


def test_a_provider_documented_below_the_manifests_ceilings_is_refused(
    staged, server, workspace, operator
):
    staged.SLUICE_ADAPTERS["staged"]["capacity"] = {"concurrency": 2}
    refusal = _refusal(workspace, operator)
    assert "above the documented capacity of 'staged' (2)" in str(refusal)
    del staged.SLUICE_ADAPTERS["staged"]["capacity"]
    assert "documents no capacity" in str(_refusal(workspace, operator))
    assert server.requests == []


def _harness(*options: str) -> None:
    call_command("run_load_harness", "--manifest", f"manifests/{MANIFEST}", *options)


def test_the_command_runs_a_staged_window_and_writes_the_record(staged, server, tmp_path):
    output = tmp_path / "staged.json"
    _harness("--target", "staged-provider", "--window-seconds", "0.5", "--output", str(output))
    record = json.loads(output.read_text())
    verify_record(record)
    assert record["window"]["seconds"] == 0.5 and record["passed"] is True
    with pytest.raises(CommandError, match="--output"):
        _harness("--target", "staged-provider", "--write-evidence")
    with pytest.raises(CommandError, match="staged-provider only"):
        _harness("--target", "evaluator", "--window-seconds", "1")
