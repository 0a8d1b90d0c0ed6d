"""The database backlog (evaluator/worker/dispatch.py): fair claims, the per-workspace cap,
heartbeats, the sweeper, fencing by claim token, and the one-uncoordinated-worker rule, on the real
database (PostgreSQL in CI)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, WorkerProcess
from evaluator.services import runs as services
from evaluator.worker import dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="someone", password="x" * 16)


def _queue(workspace: Workspace, user: Any, principal: str, count: int) -> list[EvaluationRun]:
    runs = []
    for _ in range(count):
        runs.append(
            EvaluationRun.objects.create(
                workspace=workspace,
                submitted_by=user,
                principal_id=principal,
                invocation_id=uuid.uuid4().hex,
                document=example_request(1),
                ruleset_id="demo-screening",
                ruleset_digest="sha256:" + "c" * 64,
            )
        )
    return runs


def _workspaces(*keys: str) -> list[Workspace]:
    return [Workspace.objects.create(key=key, name=key) for key in keys]


def test_claims_go_to_the_workspace_with_fewest_runs_in_flight_not_arrival_order(user):
    noisy, quiet = _workspaces("noisy", "quiet")
    burst = _queue(noisy, user, "alice", 5)
    (late,) = _queue(quiet, user, "bob", 1)

    first = dispatch.runs_claim("w1", 2)
    # Both have nothing in flight: the longest-waiting workspace goes first, then the other.
    assert [run.pk for run in first] == [burst[0].pk, late.pk]
    assert all(run.status == "running" and run.claimed_by == "w1" for run in first)
    assert all(run.deliveries == 1 and run.claim is not None for run in first)
    assert [run.pk for run in dispatch.runs_claim("w1", 10)] == [r.pk for r in burst[1:]]
    assert dispatch.runs_claim("w1", 10) == []


def test_within_a_workspace_principals_take_turns(user):
    (workspace,) = _workspaces("shared")
    alice = _queue(workspace, user, "alice", 3)
    bob = _queue(workspace, user, "bob", 2)
    order = [run.pk for run in dispatch.runs_claim("w1", 5)]
    assert order == [alice[0].pk, bob[0].pk, alice[1].pk, bob[1].pk, alice[2].pk]


def test_a_workspace_at_its_cap_waits_while_others_are_claimed(user, settings):
    settings.SLUICE_WORKSPACE_RUNS_IN_FLIGHT = 2
    noisy, quiet = _workspaces("noisy", "quiet")
    _queue(noisy, user, "alice", 5)
    claimed = dispatch.runs_claim("w1", 10)
    assert [run.workspace.key for run in claimed] == ["noisy", "noisy"]
    # Another worker's claim counts too: the cap is the deployment's.
    assert dispatch.runs_claim("w2", 10) == []
    (late,) = _queue(quiet, user, "bob", 1)
    assert [run.pk for run in dispatch.runs_claim("w2", 10)] == [late.pk]


def test_a_run_whose_heartbeat_stopped_goes_back_only_when_heartbeats_are_trusted(user):
    (workspace,) = _workspaces("acme")
    _queue(workspace, user, "alice", 2)
    stale, fresh = dispatch.runs_claim("gone-worker", 2)
    old_claim = stale.claim
    old = timezone.now() - dt.timedelta(seconds=31)
    EvaluationRun.objects.filter(pk=stale.pk).update(heartbeat_at=old)

    # Just after an outage the sweeper's own view of time is not long enough: nothing moves.
    assert dispatch.runs_sweep(trust_heartbeats=False) == []
    assert dispatch.runs_sweep(trust_heartbeats=True) == [stale.pk]
    stale.refresh_from_db()
    assert (stale.status, stale.claimed_by, stale.claim) == ("queued", "", None)
    fresh.refresh_from_db()
    assert fresh.status == "running"

    # Claimed again, it counts a second delivery; the old claim can no longer write.
    (again,) = dispatch.runs_claim("next-worker", 1)
    assert again.pk == stale.pk and again.deliveries == 2
    assert dispatch.runs_heartbeat("gone-worker", {stale.pk: old_claim}) == {stale.pk}
    assert dispatch.run_release(stale.pk, old_claim) is False
    services.run_fail(stale, "x", "late write", claim=old_claim)
    again.refresh_from_db()
    assert again.status == "running" and again.error is None
    services.run_fail(again, "x", "current claimant", claim=again.claim)
    again.refresh_from_db()
    assert again.status == "failed"
    # Finished by its own claim, it is not "taken away" from the worker that finished it.
    assert dispatch.runs_heartbeat("next-worker", {again.pk: again.claim}) == set()


def test_runs_of_a_worker_process_that_is_gone_on_this_host_go_back_at_once(user):
    (workspace,) = _workspaces("acme")
    _queue(workspace, user, "alice", 1)
    # A worker row for a process that no longer exists (a pid that just exited).
    dead = subprocess.Popen(["true"])
    dead.wait()
    WorkerProcess.objects.create(
        id="dead",
        hostname=socket.gethostname(),
        pid=dead.pid,
        pid_started=None,
        coordinated=True,
        slots=1,
        heartbeat_at=timezone.now(),
    )
    (run,) = dispatch.runs_claim("dead", 1)
    assert dispatch.runs_sweep(trust_heartbeats=False) == [run.pk]
    assert WorkerProcess.objects.get(pk="dead").stopped_at is not None


# A worker process that takes the claim lock the way `runs_claim` does and then waits, inside
# its claim, for a line on stdin; afterwards it says whether its transaction was still there.
_CLAIMANT = """
import os, sys
import django
django.setup()
from django.db import DatabaseError, connection, transaction
from evaluator.worker import dispatch
with transaction.atomic():
    dispatch.claims_serialized(dispatch.CLAIM_LOCK)
    print("holding", flush=True)
    sys.stdin.readline()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        print("still holding", flush=True)
    except DatabaseError as error:
        print("ended:", error, flush=True)
    os._exit(0)
"""


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def test_a_worker_paused_inside_its_claim_holds_up_the_others_claims_only_briefly(user):
    if connection.vendor != "postgresql":
        pytest.skip("the claim lock and its idle limit are PostgreSQL's")
    (workspace,) = _workspaces("paused")
    (queued,) = _queue(workspace, user, "alice", 1)
    paused = subprocess.Popen(
        [sys.executable, "-c", _CLAIMANT],
        env={**os.environ, "DATABASE_URL": _database_url()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert paused.stdin is not None and paused.stdout is not None
    try:
        assert paused.stdout.readline() == "holding\n"
        paused.send_signal(signal.SIGSTOP)
        # Without a bound this claim would wait for the paused worker forever; a failing test
        # ends after this long instead.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '30s'")
        claimed = dispatch.runs_claim("w-live", 1)
        assert [run.pk for run in claimed] == [queued.pk]
        paused.send_signal(signal.SIGCONT)
        paused.stdin.write("go\n")
        paused.stdin.flush()
        # The server ended the paused claim's transaction (and with it the lock): its worker,
        # running again, finds it gone.
        said = paused.stdout.readline()
        assert said.startswith("ended:") and "idle-in-transaction" in said, said
    finally:
        paused.send_signal(signal.SIGCONT)
        paused.kill()
        paused.wait(timeout=30)


def test_a_second_live_worker_is_refused_unless_both_share_admission():
    dispatch.worker_register("first", coordinated=False, slots=4)
    with pytest.raises(dispatch.WorkerRefused, match="SLUICE_ADMISSION_REDIS_URL"):
        dispatch.worker_register("second", coordinated=True, slots=4)
    dispatch.worker_stopped("first")
    dispatch.worker_register("a", coordinated=True, slots=4)
    dispatch.worker_register("b", coordinated=True, slots=4)
    with pytest.raises(dispatch.WorkerRefused):
        dispatch.worker_register("c", coordinated=False, slots=4)


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _trust() -> dispatch.HeartbeatTrust:
    # Stale window 30 s, beats every 5 s: a gap over 18.75 s is a stall.
    return dispatch.HeartbeatTrust(stale_seconds=30, heartbeat_seconds=5)


def test_heartbeats_are_trusted_after_a_whole_stale_window_of_continuous_beats():
    trust = _trust()
    assert trust.gap == dt.timedelta(seconds=18.75)
    assert not trust.trusts(_at(0))
    for second in range(0, 30, 5):
        assert trust.beat(_at(second)) is False
        assert not trust.trusts(_at(second + 1))
    assert trust.beat(_at(30)) is False
    assert trust.trusts(_at(30.5))
    # The sweep reads its own server time: long after the last beat, it does not trust.
    assert trust.trusts(_at(30 + 18.75))
    assert not trust.trusts(_at(30 + 18.76))


@pytest.mark.parametrize("where", ["in-a-beat", "before-the-sweep"])
def test_a_stall_longer_than_the_gap_withdraws_trust_for_a_whole_window(where):
    trust = _trust()
    for second in range(0, 45, 5):
        trust.beat(_at(second))
    assert trust.trusts(_at(41))
    # The database froze at 41 s for 26 s (longer than the window less a beat interval: every
    # live worker's heartbeat now looks stale).
    if where == "in-a-beat":
        assert trust.beat(_at(67)) is True
        assert not trust.trusts(_at(67.1))
        for second in range(72, 97, 5):
            trust.beat(_at(second))
            assert not trust.trusts(_at(second))
        trust.beat(_at(97))
        assert trust.trusts(_at(97.1))
    else:
        assert not trust.trusts(_at(67))


def test_a_failed_beat_withdraws_trust_until_a_whole_window_of_beats():
    trust = _trust()
    for second in range(0, 35, 5):
        trust.beat(_at(second))
    assert trust.trusts(_at(31))
    trust.lost()
    assert not trust.trusts(_at(31))
    trust.beat(_at(36))
    assert not trust.trusts(_at(60))
    for second in range(41, 71, 5):
        trust.beat(_at(second))
    assert trust.trusts(_at(66.5))


def test_the_sweep_asks_its_judge_with_its_own_server_time(user):
    (workspace,) = _workspaces("acme")
    _queue(workspace, user, "alice", 1)
    (stale,) = dispatch.runs_claim("gone-worker", 1)
    EvaluationRun.objects.filter(pk=stale.pk).update(
        heartbeat_at=timezone.now() - dt.timedelta(seconds=31)
    )
    asked: list[dt.datetime] = []

    def refuse(now: dt.datetime) -> bool:
        asked.append(now)
        return False

    assert dispatch.runs_sweep(trust_heartbeats=refuse) == []
    assert len(asked) == 1 and abs(asked[0] - timezone.now()) < dt.timedelta(seconds=5)
    assert dispatch.runs_sweep(trust_heartbeats=lambda now: True) == [stale.pk]
