"""The load-run backlog (evaluator/worker/load_dispatch.py, evaluator/services/load_runs.py): fair
claims across workspaces with a per-workspace cap, the shell's claim under the same rule, the
sweeper, fencing by claim token, cancel, and the backlog cap every interface meets, on the real
database (PostgreSQL in CI)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from admission.models import Workspace
from evaluator.models import LoadRun
from evaluator.services import load_runs
from evaluator.services import runs as services
from evaluator.services.cancellation import RunAlreadyFinished, RunCancelNotAllowed
from evaluator.worker import load_dispatch

pytestmark = pytest.mark.django_db

MANIFEST = "load-manifest.v2.json"


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="olga", password="x" * 16)


def _workspace(key: str, operator: Any) -> Workspace:
    workspace = Workspace.objects.create(key=key, name=key)
    workspace.members.add(operator, through_defaults={"role": "operator"})
    return workspace


def _queue(workspace: Workspace, user: Any, count: int, target: str = "admission-controller"):
    return [
        LoadRun.objects.create(
            workspace=workspace, submitted_by=user, manifest_name=MANIFEST, target=target
        )
        for _ in range(count)
    ]


def test_a_workspace_with_a_backlog_gets_one_run_in_flight_and_a_quiet_one_goes_next(operator):
    noisy, quiet = _workspace("noisy", operator), _workspace("quiet", operator)
    burst = _queue(noisy, operator, 30)
    (late,) = _queue(quiet, operator, 1)

    # The default cap is one load run per workspace in flight, however many slots ask.
    first = load_dispatch.load_runs_claim("w1", 4)
    assert [run.pk for run in first] == [burst[0].pk, late.pk]
    assert all(run.status == "running" and run.claim is not None for run in first)
    assert load_dispatch.load_runs_claim("w1", 4) == []

    # The quiet workspace's run ends; another of its runs arrives behind the noisy backlog.
    LoadRun.objects.filter(pk__in=[burst[0].pk, late.pk]).update(status="completed")
    (later,) = _queue(quiet, operator, 1)
    LoadRun.objects.filter(pk=later.pk).update(created_at=timezone.now() + dt.timedelta(hours=1))
    # Both have nothing in flight: the one served longest ago goes first, whatever its age.
    LoadRun.objects.filter(pk=late.pk).update(started_at=timezone.now() - dt.timedelta(hours=2))
    (next_run,) = load_dispatch.load_runs_claim("w1", 1)
    assert next_run.pk == later.pk
    (then,) = load_dispatch.load_runs_claim("w1", 1)
    assert then.pk == burst[1].pk


def test_the_cap_in_flight_is_a_setting_and_holds_across_claimants(operator):
    noisy = _workspace("noisy", operator)
    burst = _queue(noisy, operator, 5)
    with override_settings(SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT=2):
        assert [r.pk for r in load_dispatch.load_runs_claim("w1", 1)] == [burst[0].pk]
        assert [r.pk for r in load_dispatch.load_runs_claim("w2", 5)] == [burst[1].pk]
        assert load_dispatch.load_runs_claim("w3", 5) == []


def test_the_shell_claims_its_run_only_in_its_turn(operator):
    workspace = _workspace("acme", operator)
    older, mine = _queue(workspace, operator, 2)
    # An older run of the workspace waits: the shell's run does not jump it.
    assert load_dispatch.load_run_claim_one(mine.pk, "shell:1") is None
    (taken,) = load_dispatch.load_runs_claim("w1", 1)
    assert taken.pk == older.pk
    # The workspace is at its cap in flight.
    assert load_dispatch.load_run_claim_one(mine.pk, "shell:1") is None
    LoadRun.objects.filter(pk=older.pk).update(status="completed")
    claimed = load_dispatch.load_run_claim_one(mine.pk, "shell:1")
    assert claimed is not None and claimed.claimed_by == "shell:1"
    assert load_dispatch.load_run_claim_one(mine.pk, "shell:2") is None


def test_a_run_here_completes_with_its_record_and_progress(operator):
    workspace = _workspace("acme", operator)
    run = services.load_run_submit(workspace, operator, MANIFEST, "admission-controller")
    done = load_dispatch.load_run_execute(run.pk)
    assert done is not None
    assert (done.status, done.progress, done.deliveries) == ("completed", 1.0, 1)
    assert done.record["schema"] == "decision-load-result/v1"
    assert done.passed is True


def test_the_sweeper_restarts_a_virtual_time_run_and_ends_a_staged_one_interrupted(operator):
    workspace = _workspace("acme", operator)
    virtual, staged = _queue(workspace, operator, 1)[0], _queue(workspace, operator, 1, "x")[0]
    LoadRun.objects.filter(pk=staged.pk).update(target="staged-provider")
    with override_settings(SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT=2):
        claimed = {run.pk: run for run in load_dispatch.load_runs_claim("gone-worker", 2)}
    assert set(claimed) == {virtual.pk, staged.pk}
    long_ago = timezone.now() - dt.timedelta(minutes=5)
    LoadRun.objects.update(heartbeat_at=long_ago)

    # An outage everybody shared is not taken for a dead worker.
    assert load_dispatch.load_runs_sweep(trust_heartbeats=False) == []
    assert set(load_dispatch.load_runs_sweep(trust_heartbeats=True)) == {virtual.pk, staged.pk}
    virtual.refresh_from_db()
    staged.refresh_from_db()
    assert (virtual.status, virtual.claim, virtual.deliveries) == ("queued", None, 1)
    assert staged.status == "failed"
    assert staged.error["type"] == "interrupted"
    assert "not run twice" in staged.error["detail"]

    # The old claimant's token writes nothing any more.
    old = claimed[virtual.pk].claim
    assert load_runs.load_run_release(virtual.pk, old) is False
    assert load_dispatch.load_runs_heartbeat("gone-worker", {virtual.pk: old}) == {virtual.pk}
    (again,) = load_dispatch.load_runs_claim("w2", 1)
    assert (again.pk, again.deliveries) == (virtual.pk, 2)


def test_cancel_a_queued_run_at_once_and_a_running_one_through_its_claimant(
    operator, django_user_model
):
    workspace = _workspace("acme", operator)
    queued, running = _queue(workspace, operator, 2)
    viewer = django_user_model.objects.create_user(username="vic", password="x" * 16)
    workspace.members.add(viewer, through_defaults={"role": "viewer"})
    with pytest.raises(RunCancelNotAllowed):
        load_runs.load_run_cancel(queued, viewer)

    done = load_runs.load_run_cancel(queued, operator)
    assert (done.status, done.cancel_requested_by) == ("cancelled", operator)
    assert done.finished_at is not None
    # A cancelled run is never claimed.
    (claimed,) = load_dispatch.load_runs_claim("w1", 5)
    assert claimed.pk == running.pk

    asked = load_runs.load_run_cancel(claimed, operator)
    assert asked.status == "running" and asked.cancel_requested_at is not None
    watch = load_runs.LoadRunWatch(claimed, claimed.claim)
    assert watch.check() == load_runs.CANCELLED
    watch.request_stop(load_runs.CANCELLED)
    with pytest.raises(load_runs.LoadRunStopped):
        watch(0.5)
    ended = load_runs._stopped(claimed, claimed.claim, load_runs.CANCELLED)
    assert ended.status == "cancelled"
    with pytest.raises(RunAlreadyFinished):
        load_runs.load_run_cancel(ended, operator)


def test_a_claim_taken_over_is_lost_to_its_first_holder(operator):
    workspace = _workspace("acme", operator)
    _queue(workspace, operator, 1)
    (first,) = load_dispatch.load_runs_claim("w1", 1)
    watch = load_runs.LoadRunWatch(first, first.claim)
    assert watch.check() is None
    LoadRun.objects.filter(pk=first.pk).update(claim=uuid.uuid4(), claimed_by="w2")
    assert watch.check() == load_runs.LOST


def test_the_backlog_cap_refuses_every_interface_the_same_way(operator):
    workspace = _workspace("acme", operator)
    with override_settings(SLUICE_WORKSPACE_LOAD_RUNS_QUEUED=2):
        services.load_run_submit(workspace, operator, MANIFEST, "admission-controller")
        services.load_run_submit(workspace, operator, MANIFEST, "evaluator")
        with pytest.raises(services.LoadRunBacklogFull) as refused:
            services.load_run_submit(workspace, operator, MANIFEST, "admission-controller")
    assert refused.value.code == "throttled"
    assert "SLUICE_WORKSPACE_LOAD_RUNS_QUEUED" in str(refused.value)
    assert LoadRun.objects.count() == 2
