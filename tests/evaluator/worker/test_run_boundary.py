"""The run boundary (evaluator/worker/execute.py `run_boundary`) on real PostgreSQL connections:
a change of what runs start under (here the kill switch; activations and canary promotions lock
the same workspace row) lands wholly before or wholly after a run's boundary, and the run's
`startedAt` is on the same side of the change's time as what the run read."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from admission.models import RolloutEvent, Workspace, WorkspaceMembership
from admission.services import rollout
from console.forms.runs import example_request
from evaluator.models import EvaluationRun
from evaluator.worker import dispatch, execute

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HOLD_SECONDS = 0.5


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="operator", password="x" * 16)


@pytest.fixture
def workspace(operator: Any) -> Workspace:
    workspace = Workspace.objects.create(key="acme", name="acme")
    WorkspaceMembership.objects.create(
        workspace=workspace, user=operator, role=WorkspaceMembership.Role.OPERATOR
    )
    return workspace


def _claimed(workspace: Workspace, operator: Any) -> EvaluationRun:
    EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=operator,
        principal_id="alice",
        invocation_id=uuid.uuid4().hex,
        document=example_request(1),
        ruleset_id="demo-screening",
    )
    (run,) = dispatch.runs_claim("w1", 1)
    return run


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run `call` on its own thread, and so on its own database connection."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _switch_off(workspace: Workspace, operator: Any, *, hold: threading.Event | None = None):
    """Turn the kill switch off; with `hold`, keep the transaction open (and the workspace row
    locked) until the boundary has been started, then a little longer."""

    def call() -> RolloutEvent:
        with transaction.atomic():
            event = rollout.parallel_scheduling_set(
                workspace=workspace, actor=operator, allowed=False, reason="incident"
            )
            if hold is not None:
                hold.set()
                time.sleep(HOLD_SECONDS)
        return event

    return call


def test_a_change_in_progress_lands_wholly_before_the_boundary(workspace, operator):
    run = _claimed(workspace, operator)
    locked = threading.Event()
    thread, out = _in_thread(_switch_off(workspace, operator, hold=locked))
    assert locked.wait(10)
    began = time.monotonic()
    with execute.run_boundary(run):
        # Waited for the change to commit, then read it.
        waited = time.monotonic() - began
        allowed = rollout.parallel_scheduling_allowed(workspace=workspace)
    thread.join(10)
    (event,) = out
    assert waited >= HOLD_SECONDS / 2
    assert allowed is False
    run.refresh_from_db()
    assert run.started_at > event.at


def test_a_change_made_during_a_boundary_lands_wholly_after_it(workspace, operator):
    run = _claimed(workspace, operator)
    claimed_at = run.started_at
    with execute.run_boundary(run):
        allowed = rollout.parallel_scheduling_allowed(workspace=workspace)
        thread, out = _in_thread(_switch_off(workspace, operator))
        time.sleep(HOLD_SECONDS)
        # The change waits for the boundary to end.
        assert thread.is_alive()
    thread.join(10)
    (event,) = out
    assert allowed is True
    run.refresh_from_db()
    # The boundary's own instant, after the claim and before the change.
    assert claimed_at < run.started_at < event.at


def test_a_redelivered_run_keeps_its_first_start(workspace, operator):
    run = _claimed(workspace, operator)
    with execute.run_boundary(run):
        pass
    run.refresh_from_db()
    first = run.started_at
    assert dispatch.run_release(run.pk, run.claim)
    (again,) = dispatch.runs_claim("w2", 1)
    assert again.deliveries == 2
    with execute.run_boundary(again):
        pass
    again.refresh_from_db()
    assert again.started_at == first
