"""Running a claimed load run in this process: progress, cancel, and a claim that can be lost.

The harness runs in a thread of its own and reports progress to a `LoadRunWatch`; the claimant's
thread watches it. At most every `SLUICE_CANCEL_CHECK_SECONDS` the claimant writes the run's
progress and heartbeat in one compare-and-set on the claim token, which also finds out whether
somebody asked to cancel the run or whether the run is not this claim's any more (taken back by a
sweeper, ended elsewhere). Then the watch raises `LoadRunStopped` at the harness's next progress
report, which stops the run (evaluator/harness/replay.py), and the claimant writes the run
`cancelled`, leaves it alone, or gives it back. The harness's thread never touches the database.

Hooks registered with `on_progress` see every progress report of every load run this process
runs, in the harness's thread (a test holds a run still there to kill or cancel it mid-run).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from admission import access
from evaluator import qualification
from evaluator.deployment import AdapterConfigError
from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.records import TARGET_STAGED
from evaluator.models import LoadRun
from evaluator.services import server_clock
from evaluator.services.cancellation import (
    RunAlreadyFinished,
    RunCancelNotAllowed,
    cancel_request_save,
)
from evaluator.services.runs import run_fail, run_finish

__all__ = [
    "INTERRUPTED",
    "LoadRunStopped",
    "LoadRunWatch",
    "ProgressHook",
    "load_run_cancel",
    "load_run_execute_claimed",
    "load_run_give_back",
    "load_run_release",
    "may_cancel_load_run",
    "on_progress",
]

logger = logging.getLogger(__name__)

CANCELLED = "cancelled"
LOST = "lost"
STOPPING = "stopping"
INTERRUPTED = "interrupted"


class LoadRunStopped(Exception):
    """Raised from the harness's progress callback to stop a load run; `why` says what for."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


ProgressHook = Callable[["LoadRunWatch", float], None]

_on_progress: list[ProgressHook] = []


def on_progress(hook: ProgressHook) -> Callable[[], None]:
    """Call `hook(watch, fraction)` at every progress report of every load run this process runs,
    in the harness's thread; returns its remover. A hook that waits should call
    `watch.raise_if_stopped()` meanwhile, so that a cancel or a lost claim still stops the run."""
    _on_progress.append(hook)
    return lambda: _on_progress.remove(hook)


def _check_seconds() -> float:
    return float(getattr(settings, "SLUICE_CANCEL_CHECK_SECONDS", 1.0))


class LoadRunWatch:
    """Between the harness's thread (`__call__`, its progress callback) and the claimant's
    (`check`, `request_stop`); see the module doc."""

    def __init__(self, run: LoadRun, token: uuid.UUID) -> None:
        self.run_id = run.pk
        self.token = token
        self.fraction = 0.0
        self._stop = threading.Event()
        self._why = ""

    def __call__(self, fraction: float) -> None:
        self.fraction = fraction
        self.raise_if_stopped()
        for hook in list(_on_progress):
            hook(self, fraction)

    def raise_if_stopped(self) -> None:
        """Raise `LoadRunStopped` once the claimant asked the run to stop."""
        if self._stop.is_set():
            raise LoadRunStopped(self._why)

    def request_stop(self, why: str) -> None:
        if not self._stop.is_set():
            self._why = why
            self._stop.set()

    def check(self) -> str | None:
        """Write progress and heartbeat; returns why the run must stop, or None."""
        try:
            with transaction.atomic():
                now = server_clock.now()
                updated = LoadRun.objects.filter(
                    pk=self.run_id,
                    claim=self.token,
                    status=LoadRun.Status.RUNNING,
                    cancel_requested_at__isnull=True,
                ).update(progress=self.fraction, heartbeat_at=now, updated_at=now)
                if updated:
                    return None
                row = LoadRun.objects.filter(pk=self.run_id).values("claim", "status").first()
        except DatabaseError as error:
            # The runner's heartbeat decides whether the run is still ours; go on meanwhile.
            logger.warning("load run %s: progress not written (%s)", self.run_id, error)
            return None
        running = row is not None and row["status"] == LoadRun.Status.RUNNING
        held = running and row is not None and row["claim"] == self.token
        return CANCELLED if held else LOST


def load_run_execute_claimed(
    run: LoadRun, token: uuid.UUID, *, stop: threading.Event | None = None
) -> LoadRun:
    """Run the harness for `run`, claimed with `token`, and keep its record on the row.

    `stop` set (the worker is shutting down) stops the run: a virtual-time run goes back to
    the backlog, a staged-provider run ends `failed` / `interrupted`.
    """
    # Read here what the harness needs from the database: its thread never queries.
    run.what_if_version  # noqa: B018
    timelines: list[Any] = []
    watch = LoadRunWatch(run, token)
    outcome: dict[str, Any] = {}

    def harness() -> None:
        try:
            outcome["record"] = qualification.execute(
                run, keep_timeline=timelines.append, progress=watch
            )
        except BaseException as error:  # handed to the claimant's thread below
            outcome["error"] = error

    thread = threading.Thread(target=harness, name=f"sluice-load-{run.pk}", daemon=True)
    thread.start()
    while True:
        thread.join(_check_seconds())
        if not thread.is_alive():
            break
        why = watch.check()
        if why is None and stop is not None and stop.is_set():
            why = STOPPING
        if why is not None:
            watch.request_stop(why)
    error = outcome.get("error")
    if isinstance(error, LoadRunStopped):
        return _stopped(run, token, error.why)
    if isinstance(error, FileNotFoundError):
        return run_fail(
            run,
            "manifest-missing",
            f"{run.manifest_name} is not under manifests/",
            claim=token,
        )
    if isinstance(error, LoadHarnessError):
        return run_fail(run, "load-harness", str(error), claim=token)
    if isinstance(error, AdapterConfigError):
        return run_fail(run, "configuration", str(error), claim=token)
    if error is not None:
        raise error
    record = outcome["record"]
    return run_finish(
        run,
        status=LoadRun.Status.COMPLETED,
        claim=token,
        record=record,
        timeline=timelines[-1] if timelines else None,
        passed=bool(record.get("passed")),
        manifest_digest=record.get("manifest", {}).get("digest", ""),
        progress=1.0,
    )


def load_run_release(run_id: uuid.UUID, token: uuid.UUID | None) -> bool:
    """Give a load run this claim holds back to the backlog; False when it is not held any more."""
    updated = LoadRun.objects.filter(pk=run_id, claim=token, status=LoadRun.Status.RUNNING).update(
        status=LoadRun.Status.QUEUED,
        claimed_by="",
        claim=None,
        heartbeat_at=None,
        progress=None,
        updated_at=server_clock.now(),
    )
    return updated == 1


def _interrupt(run_id: uuid.UUID, token: uuid.UUID | None, detail: str) -> bool:
    now = server_clock.now()
    updated = LoadRun.objects.filter(pk=run_id, claim=token, status=LoadRun.Status.RUNNING).update(
        status=LoadRun.Status.FAILED,
        error={"type": INTERRUPTED, "detail": detail},
        finished_at=now,
        updated_at=now,
    )
    return updated == 1


def load_run_give_back(run: Any, token: uuid.UUID | None, why: str) -> str:
    """A claimant stops holding `run` before it ended: a virtual-time run goes back to the
    backlog (it starts again), a staged-provider run ends `failed` / `interrupted`. Returns the
    run's status afterwards, or "" when the claim did not hold it any more."""
    if run.target == TARGET_STAGED:
        detail = (
            f"{why}; a staged-provider run is not run twice, since its calls reached the "
            "staged endpoint at real time: start it again"
        )
        return LoadRun.Status.FAILED if _interrupt(run.pk, token, detail) else ""
    return LoadRun.Status.QUEUED if load_run_release(run.pk, token) else ""


def _stopped(run: LoadRun, token: uuid.UUID, why: str) -> LoadRun:
    if why == CANCELLED:
        logger.info("load run %s cancelled mid-run", run.pk)
        return run_finish(run, status=LoadRun.Status.CANCELLED, claim=token)
    if why == STOPPING:
        status = load_run_give_back(run, token, "its worker stopped mid-run")
        logger.warning("load run %s: its worker stops; now %s", run.pk, status or "not ours")
    else:
        logger.warning("load run %s is no longer this claim's; stopped it", run.pk)
    run.refresh_from_db()
    return run


def may_cancel_load_run(user: Any, run: LoadRun) -> bool:
    """Operators cancel any load run of their workspace; whoever started a what-if run may
    cancel it while they may still start one."""
    if access.can(user, access.RUN_LOAD, run.workspace):
        return True
    return (
        run.what_if_version_id is not None
        and run.submitted_by_id == getattr(user, "pk", None)
        and access.can(user, access.PROPOSE, run.workspace)
    )


def load_run_cancel(run: LoadRun, user: Any) -> LoadRun:
    """Cancel a load run for `user` (who may start load runs in its workspace); returns it as
    it is now: `cancelled` when it was queued, else still `running` with the request recorded,
    which the process running it reads at its next progress report (about a second).

    Raises `RunCancelNotAllowed` or `RunAlreadyFinished`.
    """
    if not may_cancel_load_run(user, run):
        raise RunCancelNotAllowed(
            f"only operators cancel load runs in workspace {run.workspace.key} (and proposers "
            "their own what-if runs)"
        )
    with transaction.atomic():
        locked = (
            LoadRun.objects.select_for_update(of=("self",))
            .select_related("workspace", "submitted_by", "what_if_version")
            .get(pk=run.pk)
        )
        if locked.finished:
            raise RunAlreadyFinished(
                f"the load run already ended ({locked.status})", status=locked.status
            )
        cancel_request_save(locked, user)
    logger.info(
        "load run %s: cancel requested by %s (now %s)",
        locked.pk,
        user.get_username(),
        locked.status,
    )
    return locked
