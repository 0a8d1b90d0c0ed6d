"""The backlog of load runs in the database: claim fairly, heartbeat, sweep, give back.

Load runs (what-if runs included) travel as evaluation runs do (evaluator/worker/dispatch.py): the
`queued` row is the queue entry, a claim sets a fresh `claim` token that every later write
names, the claimant heartbeats, and a run whose claimant is gone is taken back. The pick is fair
across workspaces: a workspace already running `SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT` load runs
anywhere in the deployment is skipped; of the others, each pick goes to the one with the fewest
in flight, then to the one served longest ago (round robin, so a workspace with a long backlog
cannot keep a quiet one waiting behind it), and within it to its oldest run. Claims are
serialized by a transaction-scoped advisory lock on PostgreSQL (SQLite serializes writers
itself), so the cap holds exactly.

The shell runs a load run in its own process (`load_run_execute`) after claiming it here under
the same cap and order as every worker.

A run taken back from a dead claimant starts again when it runs on virtual time (nothing of it
left the process). A staged-provider run sent real calls at real time: it is not run twice, it
ends `failed` with error type `interrupted`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from evaluator.models import LoadRun, WorkerProcess
from evaluator.services import server_clock
from evaluator.services.load_runs import load_run_execute_claimed, load_run_give_back
from evaluator.worker.dispatch import claims_serialized, gone_workers, run_take, trusted

__all__ = [
    "load_run_claim_one",
    "load_run_execute",
    "load_runs_claim",
    "load_runs_heartbeat",
    "load_runs_sweep",
]

logger = logging.getLogger(__name__)

QUEUED = LoadRun.Status.QUEUED
RUNNING = LoadRun.Status.RUNNING
# pg_advisory_xact_lock key for load-run claims ("sluicl" in ASCII, truncated).
_CLAIM_LOCK = 0x736C75696C


def _in_flight() -> Counter[int]:
    counts: Counter[int] = Counter()
    for row in (
        LoadRun.objects.filter(status=RUNNING).values("workspace_id").annotate(n=Count("id"))
    ):
        counts[row["workspace_id"]] = row["n"]
    return counts


def _take(run: LoadRun, worker_id: str) -> bool:
    """Claim `run` (locked, queued) for `worker_id`; False when somebody else got it."""
    taken = run_take(run, worker_id, progress=0.0)
    if taken and run.deliveries > 1:
        logger.warning("%s claimed again (delivery %d); it starts again", run, run.deliveries)
    return taken


def load_runs_claim(worker_id: str, limit: int) -> list[LoadRun]:
    """Claim up to `limit` queued load runs for `worker_id`, fairly (see the module doc)."""
    if limit <= 0:
        return []
    cap = int(settings.SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT)
    claimed: list[LoadRun] = []
    with transaction.atomic():
        claims_serialized(_CLAIM_LOCK)
        oldest: dict[int, datetime] = {
            row["workspace_id"]: row["first"]
            for row in LoadRun.objects.filter(status=QUEUED)
            .values("workspace_id")
            .annotate(first=Min("created_at"))
        }
        if not oldest:
            return []
        running = _in_flight()
        # When each workspace last had a load run started: the round robin's memory.
        epoch = datetime.min.replace(tzinfo=timezone.get_current_timezone())
        served: dict[int, datetime] = dict.fromkeys(oldest, epoch)
        for row in (
            LoadRun.objects.filter(workspace_id__in=list(oldest), started_at__isnull=False)
            .values("workspace_id")
            .annotate(last=Max("started_at"))
        ):
            served[row["workspace_id"]] = row["last"]
        while len(claimed) < limit:
            waiting = [w for w in oldest if running[w] < cap]
            if not waiting:
                break
            workspace = min(waiting, key=lambda w: (running[w], served[w], oldest[w]))
            run = (
                LoadRun.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("workspace")
                .filter(status=QUEUED, workspace_id=workspace)
                .order_by("created_at", "id")
                .first()
            )
            if run is None:
                del oldest[workspace]
                continue
            if not _take(run, worker_id):
                continue
            claimed.append(run)
            running[workspace] += 1
            served[workspace] = server_clock.now()
    return claimed


def load_run_claim_one(run_id: uuid.UUID | str, worker_id: str) -> LoadRun | None:
    """Claim the queued load run `run_id` for `worker_id` when it is its turn: its workspace is
    below its cap in flight and the run is the workspace's oldest queued one. None otherwise.

    The shell runs its own load runs in its own process this way, under the same cap and order
    as every worker.
    """
    cap = int(settings.SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT)
    with transaction.atomic():
        claims_serialized(_CLAIM_LOCK)
        run = (
            LoadRun.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("workspace", "what_if_version__workspace")
            .filter(pk=run_id, status=QUEUED)
            .first()
        )
        if run is None:
            return None
        if _in_flight()[run.workspace_id] >= cap:
            return None
        older = LoadRun.objects.filter(status=QUEUED, workspace_id=run.workspace_id).filter(
            Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, id__lt=run.id)
        )
        if older.exists():
            return None
        return run if _take(run, worker_id) else None


def load_run_execute(
    run_id: uuid.UUID | str, *, wait_seconds: float = 0.0, poll_seconds: float = 0.5
) -> LoadRun | None:
    """Run a queued load run in this process once it is its turn (the shell's way), or wait for
    whoever runs it; returns the run as it stands after `wait_seconds` or when it ended.

    It is claimed exactly as a worker would claim it (`load_run_claim_one`: the workspace's cap
    in flight and its order hold), so the shell cannot jump the queue.
    """
    claimant = f"shell:{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + wait_seconds
    while True:
        run = load_run_claim_one(run_id, claimant)
        if run is not None:
            assert run.claim is not None
            return load_run_execute_claimed(run, run.claim)
        current = LoadRun.objects.filter(pk=run_id).first()
        if current is None or current.finished or time.monotonic() >= deadline:
            return current
        time.sleep(poll_seconds)


def load_runs_heartbeat(
    worker_id: str, claims: Mapping[uuid.UUID, uuid.UUID], *, at: datetime | None = None
) -> set[uuid.UUID]:
    """Beat for the load runs this worker holds (run id → claim token) at server time `at`
    (read here when None); returns the ids of runs no longer held by it (taken back, claimed
    again, or ended by somebody else)."""
    if not claims:
        return set()
    held = set(
        LoadRun.objects.filter(
            claim__in=list(claims.values()), claimed_by=worker_id, status=RUNNING
        ).values_list("claim", flat=True)
    )
    if held:
        LoadRun.objects.filter(claim__in=held, status=RUNNING).update(
            heartbeat_at=server_clock.now() if at is None else at
        )
    return {run_id for run_id, token in claims.items() if token not in held}


def load_runs_sweep(*, trust_heartbeats: bool | Callable[[datetime], bool]) -> list[uuid.UUID]:
    """Take back every running load run whose claimant is gone (see `dispatch.runs_sweep` for
    when a claimant counts as gone); returns their ids."""
    now = server_clock.now()
    stale = now - timedelta(seconds=float(settings.SLUICE_RUN_STALE_SECONDS))
    gone_workers()
    # Workers marked stopped (by a sweep, here or in `dispatch.runs_sweep`) hold nothing any more.
    stopped = WorkerProcess.objects.filter(stopped_at__isnull=False).values("id")
    lost = Q(claimed_by__in=stopped)
    if trusted(trust_heartbeats, now):
        lost |= Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, updated_at__lt=stale)
    taken = []
    for run in LoadRun.objects.filter(lost, status=RUNNING).only(
        "pk", "target", "claimed_by", "claim", "manifest_name"
    ):
        holder = run.claimed_by or "?"
        status = load_run_give_back(run, run.claim, f"its worker {holder} stopped mid-run")
        if status:
            logger.warning("load run %s: its worker %s stopped; now %s", run.pk, holder, status)
            taken.append(run.pk)
    return taken
