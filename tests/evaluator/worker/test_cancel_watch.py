"""The cancel watch in one process, against the real database: one check serves every run on the
loop and fires only the cancelled ones; a run whose cancel was asked before its watch began is
cancelled at once (the engine then dispatches nothing: tests/evaluator/test_scheduler.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.models import EvaluationRun
from evaluator.worker import cancel_watch

pytestmark = pytest.mark.django_db(transaction=True)


def _run(workspace: Workspace, invocation: str, **values: Any) -> EvaluationRun:
    user = get_user_model().objects.get(username="demo-proposer")
    document = example_request(2)
    return EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=user,
        principal_id=user.username,
        invocation_id=invocation,
        document=document,
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "0" * 64,
        decision_count=2,
        **values,
    )


def test_one_check_serves_every_watched_run_and_fires_only_the_cancelled_ones(
    demo, settings, monkeypatch
):
    settings.SLUICE_CANCEL_CHECK_SECONDS = 0.05
    runs = [_run(demo, f"inv-{index}", status="running") for index in range(3)]
    checks: list[set[Any]] = []
    real = cancel_watch.cancel_requested

    async def counted(run_ids: Any) -> set[Any]:
        checks.append(set(run_ids))
        return await real(run_ids)

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            signals = [
                await stack.enter_async_context(
                    cancel_watch.run_cancel_signal("demo", run.invocation_id)
                )
                for run in runs
            ]
            assert cancel_watch.watched_runs() == {run.pk for run in runs}
            assert not any(signal.cancelled for signal in signals)
            # From here on, count the periodic checks (the first ones were per run).
            monkeypatch.setattr(cancel_watch, "cancel_requested", counted)
            await sync_to_async(_request_cancel, thread_sensitive=True)(runs[1].pk)
            reason = await asyncio.wait_for(signals[1], timeout=10)
            assert reason == "cancelled"
            assert [signal.cancelled for signal in signals] == [False, True, False]
        assert cancel_watch.watched_runs() == set()
        # Each periodic check asked about every watched run at once.
        assert checks
        assert all(ids == {run.pk for run in runs} for ids in checks)
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    asyncio.run(scenario())


def _request_cancel(run_id: Any) -> None:
    EvaluationRun.objects.filter(pk=run_id).update(cancel_requested_at=timezone.now())


def test_a_run_whose_cancel_came_before_its_watch_began_is_cancelled_at_once(demo, settings):
    # No periodic check within the test: only the check at the start can fire the signal.
    settings.SLUICE_CANCEL_CHECK_SECONDS = 3600
    # Its worker died; the cancel request is on the row when the run is taken up again.
    run = _run(demo, "inv-resumed", status="running", deliveries=1)
    _request_cancel(run.pk)
    fresh = _run(demo, "inv-fresh", status="running")

    async def scenario() -> None:
        async with cancel_watch.run_cancel_signal("demo", "inv-resumed") as resumed:
            assert resumed.cancelled
            assert resumed.reason == "cancelled"
        async with cancel_watch.run_cancel_signal("demo", "inv-fresh") as running:
            assert not running.cancelled
            assert cancel_watch.watched_runs() == {fresh.pk}
        # An evaluation with no run row (the harness, a test of the engine) is not watched.
        async with cancel_watch.run_cancel_signal("demo", "no-such-run") as unwatched:
            assert not unwatched.cancelled
            assert cancel_watch.watched_runs() == set()
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    asyncio.run(scenario())
