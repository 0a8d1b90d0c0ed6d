"""The backlog of evaluation runs in the database: claim fairly, heartbeat, sweep, give back.

The run row is the truth; a broker message only says "look" (evaluator/worker/runner.py). Every
function here is one short transaction and safe to call from several worker processes at once:

- `runs_claim` takes queued runs for a worker, fairly across workspaces and principals: each
  pick goes to the workspace with the fewest runs in flight (ties: the one whose oldest queued
  run has waited longest), within it to the principal with the fewest, and then to that
  principal's oldest run. A workspace already at `SLUICE_WORKSPACE_RUNS_IN_FLIGHT` is skipped.
  On PostgreSQL claims are serialized by a transaction-scoped advisory lock (so the cap holds
  exactly) and rows are taken `FOR UPDATE SKIP LOCKED`; SQLite serializes write transactions
  itself (`transaction_mode=IMMEDIATE`), and every claim is a compare-and-set on `status`.
  A worker paused inside a claim (SIGSTOP, a frozen VM, a stalled thread) would hold that lock,
  and with it every other worker's claims, beats and sweeps, for as long as it is paused: the
  server ends a claim transaction left idle for `CLAIM_IDLE_LIMIT_MS` (its work rolled back,
  its connection closed; the worker reconnects when it runs again).
- Each claim sets a fresh `claim` token. Heartbeats, the final write and giving a run back all
  name the token, so a worker whose run was taken back cannot overwrite the next claimant's.
- `runs_sweep` gives back to the backlog every `running` run whose claimant stopped
  heartbeating (or, on this host, whose process no longer exists). A sweeper judges other
  workers' heartbeats only while its own view of the database has been continuous
  (`HeartbeatTrust`): an outage or a stall that every worker shared ages every heartbeat at
  once, and must not pass for the death of the live ones.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Min, Q

from evaluator.models import EvaluationRun, LoadRun, WorkerProcess
from evaluator.services import server_clock

__all__ = [
    "CLAIM_IDLE_LIMIT_MS",
    "CLAIM_LOCK",
    "HeartbeatTrust",
    "WorkerRefused",
    "claims_serialized",
    "gone_workers",
    "process_start_ticks",
    "run_release",
    "run_take",
    "runs_claim",
    "runs_heartbeat",
    "runs_sweep",
    "trusted",
    "worker_register",
    "worker_stopped",
]

logger = logging.getLogger(__name__)

QUEUED = EvaluationRun.Status.QUEUED
RUNNING = EvaluationRun.Status.RUNNING
# pg_advisory_xact_lock key for claims and worker registration ("sluice" in ASCII, truncated).
CLAIM_LOCK = 0x736C756963
# A claim transaction is a few statements sent back to back (milliseconds); one idle between two
# of them for this long belongs to a paused worker, and PostgreSQL ends it. The others'
# dispatchers wait on the lock meanwhile: a second is short next to the gap between a worker's
# own beats after which it stops trusting heartbeats (HeartbeatTrust; 18.75 s by default).
CLAIM_IDLE_LIMIT_MS = 1000


class WorkerRefused(Exception):
    """This worker process must not run evaluations beside the live workers (it says why)."""


def claims_serialized(lock: int) -> None:
    """Serialize the rest of this transaction with every other that asks for `lock`: a
    transaction-scoped advisory lock on PostgreSQL; SQLite serializes writers itself.

    A transaction of its own (the worker's claims) is ended by the server if it then idles for
    `CLAIM_IDLE_LIMIT_MS`; inside a caller's larger transaction the limit would outlive the
    claim, and the caller's own rules stand.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if connection.savepoint_ids:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock])
        else:
            cursor.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true), "
                "pg_advisory_xact_lock(%s)",
                [str(CLAIM_IDLE_LIMIT_MS), lock],
            )


def run_take(run: EvaluationRun | LoadRun, worker_id: str, **also: Any) -> bool:
    """Claim `run` (locked, queued) for `worker_id` under a fresh claim token, with `also` (more
    fields) set besides: a compare-and-set on `status`, mirrored on `run`. False when somebody
    else got it. Both run kinds (evaluation and load runs) spell `queued` and `running` alike."""
    now = server_clock.now()
    run.status = RUNNING
    run.claimed_by = worker_id
    run.claim = uuid.uuid4()
    run.heartbeat_at = now
    run.deliveries += 1
    if run.started_at is None:
        run.started_at = now
    for name, value in also.items():
        setattr(run, name, value)
    updated = (
        type(run)
        .objects.filter(pk=run.pk, status=QUEUED)
        .update(
            status=RUNNING,
            claimed_by=worker_id,
            claim=run.claim,
            heartbeat_at=now,
            deliveries=run.deliveries,
            started_at=run.started_at,
            updated_at=now,
            **also,
        )
    )
    return updated == 1


class HeartbeatTrust:
    """When a sweeper may take a stale heartbeat for a dead claimant.

    A heartbeat older than the stale window means its worker died only if the database answered
    that worker all along. Each worker knows that of itself: its own beats, on the database's
    clock, succeed about `SLUICE_RUN_HEARTBEAT_SECONDS` apart while the database answers. A
    stall of the database shorter than the stale window less one heartbeat interval leaves every
    live worker's heartbeat younger than the stale window. A longer one shows to each worker as
    a gap longer than `gap` (three quarters of that: at least one and a half heartbeat
    intervals, since the window is at least three) between two of its beats, or between its
    last beat and the sweep; a failed beat (`lost`) means the database was unreachable. Either
    way every other worker's heartbeat aged just as much, so the sweeper trusts heartbeats again
    only after a whole stale window of continuous beats, and never across a gap, wherever the
    stall fell (in a beat, between the beat and the sweep, or in the sweep's own first
    statement: the sweep asks with its own server time).
    """

    def __init__(self, *, stale_seconds: float, heartbeat_seconds: float) -> None:
        self.window = timedelta(seconds=stale_seconds)
        self.gap = timedelta(seconds=(stale_seconds - heartbeat_seconds) * 3 / 4)
        self._since: datetime | None = None
        self._last: datetime | None = None

    @classmethod
    def from_settings(cls) -> HeartbeatTrust:
        return cls(
            stale_seconds=float(settings.SLUICE_RUN_STALE_SECONDS),
            heartbeat_seconds=float(settings.SLUICE_RUN_HEARTBEAT_SECONDS),
        )

    def beat(self, at: datetime) -> bool:
        """This worker's beat stamped `at` is written; True when it follows a stall (a gap
        after an earlier beat)."""
        stalled = self._last is not None and at - self._last > self.gap
        if self._last is None or stalled:
            self._since = at
        self._last = at
        return stalled

    def lost(self) -> None:
        """A beat or a sweep failed: the database was not reachable."""
        self._since = self._last = None

    def trusts(self, now: datetime) -> bool:
        """May a sweep running at server time `now` judge other workers' heartbeats?"""
        if self._since is None or self._last is None:
            return False
        return now - self._last <= self.gap and now - self._since >= self.window


# --------------------------------------------------------------------------- worker rows


def process_start_ticks(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (Linux), None if unknown."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii").read()  # noqa: SIM115
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _gone(worker: WorkerProcess) -> bool:
    """True when `worker` ran on this host and its process no longer exists."""
    if worker.hostname != socket.gethostname():
        return False
    ticks = process_start_ticks(worker.pid)
    return ticks is None or (worker.pid_started is not None and ticks != worker.pid_started)


def worker_register(worker_id: str, *, coordinated: bool, slots: int) -> WorkerProcess:
    """Record this worker process; raises `WorkerRefused` when admission is kept in-process
    (not `coordinated`) on either side and another worker process is alive."""
    with transaction.atomic():
        claims_serialized(CLAIM_LOCK)
        now = server_clock.now()
        stale = now - timedelta(seconds=float(settings.SLUICE_RUN_STALE_SECONDS))
        live = [
            worker
            for worker in WorkerProcess.objects.filter(
                stopped_at__isnull=True, heartbeat_at__gte=stale
            ).exclude(pk=worker_id)
            if not _gone(worker)
        ]
        clash = [w for w in live if not (coordinated and w.coordinated)]
        if clash:
            raise WorkerRefused(
                f"worker {clash[0].id} is running and admission is not shared between worker "
                "processes (SLUICE_ADMISSION_REDIS_URL is empty on one of them): two such "
                "processes would each allow the full limits. Stop it, or set "
                "SLUICE_ADMISSION_REDIS_URL on every worker (docs/admission-coordination.md)."
            )
        pid = os.getpid()
        return WorkerProcess.objects.create(
            id=worker_id,
            hostname=socket.gethostname(),
            pid=pid,
            pid_started=process_start_ticks(pid),
            coordinated=coordinated,
            slots=slots,
            heartbeat_at=now,
        )


def worker_stopped(worker_id: str) -> None:
    WorkerProcess.objects.filter(pk=worker_id).update(stopped_at=server_clock.now())


# -------------------------------------------------------------------------------- claims


def runs_claim(worker_id: str, limit: int) -> list[EvaluationRun]:
    """Claim up to `limit` queued runs for `worker_id`, fairly (see the module docstring)."""
    if limit <= 0:
        return []
    cap = int(settings.SLUICE_WORKSPACE_RUNS_IN_FLIGHT)
    claimed: list[EvaluationRun] = []
    with transaction.atomic():
        claims_serialized(CLAIM_LOCK)
        heads: dict[tuple[int, str], Any] = {
            (row["workspace_id"], row["principal_id"]): row["first"]
            for row in EvaluationRun.objects.filter(status=QUEUED)
            .values("workspace_id", "principal_id")
            .annotate(first=Min("created_at"))
        }
        if not heads:
            return []
        by_principal: Counter[tuple[int, str]] = Counter()
        by_workspace: Counter[int] = Counter()
        for row in (
            EvaluationRun.objects.filter(status=RUNNING)
            .values("workspace_id", "principal_id")
            .annotate(n=Count("id"))
        ):
            by_principal[(row["workspace_id"], row["principal_id"])] += row["n"]
            by_workspace[row["workspace_id"]] += row["n"]
        while len(claimed) < limit and heads:
            waiting: dict[int, Any] = {}
            for (workspace, _), first in heads.items():
                if by_workspace[workspace] < cap and (
                    workspace not in waiting or first < waiting[workspace]
                ):
                    waiting[workspace] = first
            if not waiting:
                break
            workspace = min(waiting, key=lambda w: (by_workspace[w], waiting[w]))
            group = min(
                (key for key in heads if key[0] == workspace),
                key=lambda key: (by_principal[key], heads[key]),
            )
            run = (
                EvaluationRun.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("workspace")
                .filter(status=QUEUED, workspace_id=group[0], principal_id=group[1])
                .order_by("created_at", "id")
                .first()
            )
            if run is None:
                del heads[group]
                continue
            if not run_take(run, worker_id):
                continue
            claimed.append(run)
            by_workspace[workspace] += 1
            by_principal[group] += 1
            # The next run of the group is younger; it keeps its place until asked again.
            heads[group] = max(heads[group], run.created_at)
    for run in claimed:
        if run.deliveries > 1:
            logger.warning("%s claimed again (delivery %d); resuming", run, run.deliveries)
    return claimed


def runs_heartbeat(
    worker_id: str, claims: Mapping[uuid.UUID, uuid.UUID], *, at: datetime | None = None
) -> set[uuid.UUID]:
    """Beat for the worker and for its runs (run id → claim token) at server time `at` (read
    here when None); returns the ids of runs taken away from this worker (given back, or
    claimed again by another). A run this claim finished is not taken away: its coroutine is
    just about to return."""
    now = server_clock.now() if at is None else at
    WorkerProcess.objects.filter(pk=worker_id).update(heartbeat_at=now)
    if not claims:
        return set()
    held = set(
        EvaluationRun.objects.filter(
            claim__in=list(claims.values()), claimed_by=worker_id
        ).values_list("claim", flat=True)
    )
    if held:
        EvaluationRun.objects.filter(claim__in=held, status=RUNNING).update(heartbeat_at=now)
    return {run_id for run_id, token in claims.items() if token not in held}


def run_release(run_id: uuid.UUID, token: uuid.UUID) -> bool:
    """Give a run this worker holds back to the backlog; False when it was not held any more."""
    updated = EvaluationRun.objects.filter(pk=run_id, claim=token, status=RUNNING).update(
        status=QUEUED,
        claimed_by="",
        claim=None,
        heartbeat_at=None,
        updated_at=server_clock.now(),
    )
    return updated == 1


def gone_workers() -> list[str]:
    """Mark stopped every live-looking worker of this host whose process no longer exists;
    returns their ids."""
    gone = [w.id for w in WorkerProcess.objects.filter(stopped_at__isnull=True) if _gone(w)]
    if gone:
        WorkerProcess.objects.filter(pk__in=gone).update(stopped_at=server_clock.now())
    return gone


def trusted(trust_heartbeats: bool | Callable[[datetime], bool], now: datetime) -> bool:
    """`trust_heartbeats` as a yes or no for a sweep at server time `now`."""
    return trust_heartbeats(now) if callable(trust_heartbeats) else trust_heartbeats


def runs_sweep(*, trust_heartbeats: bool | Callable[[datetime], bool]) -> list[uuid.UUID]:
    """Give back every run whose claimant is gone; returns their ids.

    A claimant is gone when it ran on this host and its process no longer exists, or (only when
    `trust_heartbeats`, a yes or no or a judge asked with this sweep's server time, such as
    `HeartbeatTrust.trusts`, says so) when the run's heartbeat is older than
    `SLUICE_RUN_STALE_SECONDS`.
    """
    now = server_clock.now()
    stale = now - timedelta(seconds=float(settings.SLUICE_RUN_STALE_SECONDS))
    gone = gone_workers()
    lost = Q(claimed_by__in=gone)
    if trusted(trust_heartbeats, now):
        lost |= Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, updated_at__lt=stale)
        WorkerProcess.objects.filter(heartbeat_at__lt=now - timedelta(days=1)).delete()
    found = list(
        EvaluationRun.objects.filter(lost, status=RUNNING).values_list("pk", "claimed_by", "claim")
    )
    taken = []
    for run_id, holder, token in found:
        if token is None or run_release(run_id, token):
            if token is None:
                EvaluationRun.objects.filter(pk=run_id, status=RUNNING).update(
                    status=QUEUED, claimed_by="", heartbeat_at=None, updated_at=now
                )
            logger.warning(
                "evaluation %s: its worker %s stopped; back in the backlog", run_id, holder or "?"
            )
            taken.append(run_id)
    return taken
