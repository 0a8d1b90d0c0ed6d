"""How a cancel request reaches the process that runs the evaluation, wherever it runs.

Cancelling writes `EvaluationRun.cancel_requested_at` (evaluator/services/cancellation.py): the
request lives in the database, like the run, so it reaches a worker on any host and survives a
broker or Redis restart. A process running evaluations keeps one watch per event loop: the cancel
signal of every run it is running, keyed by run id, and one asyncio task that, every
`SLUICE_CANCEL_CHECK_SECONDS` (default 1 s) while any run is watched, asks the database in a
single query which of them have a cancel request and fires their signals. A run is also checked
once when its watch starts (the run is found by its workspace and invocation id, which the
engine's request carries), so a run whose cancel arrived before a worker took it up (or while
its previous worker was dead) dispatches nothing.

A fired signal stops the run as the engine stops any cancelled run: an attempt waiting for
admission leaves its queue at once (rejected `cancelled`, never sent), an adapter call in flight
is aborted (`execution-uncertain`, reason `cancelled`: it was sent), unstarted decisions end
`cancelled`, and the run ends `cancelled` with every decision's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from admission.core import CancelSignal
from evaluator.models import EvaluationRun

__all__ = ["CANCEL_REASON", "check_interval", "run_cancel_signal"]

logger = logging.getLogger(__name__)

CANCEL_REASON = "cancelled"
DEFAULT_CHECK_SECONDS = 1.0


def check_interval() -> float:
    """Seconds between two checks for cancel requests (`SLUICE_CANCEL_CHECK_SECONDS`)."""
    value = getattr(settings, "SLUICE_CANCEL_CHECK_SECONDS", DEFAULT_CHECK_SECONDS)
    return float(value) if value and value > 0 else DEFAULT_CHECK_SECONDS


def _requested_sync(run_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    try:
        return set(
            EvaluationRun.objects.filter(
                pk__in=run_ids, cancel_requested_at__isnull=False
            ).values_list("pk", flat=True)
        )
    except DatabaseError:
        # A connection the server dropped is closed here, so the next check opens a new one.
        close_old_connections()
        raise


async def cancel_requested(run_ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    """Which of `run_ids` somebody asked to cancel (one query)."""
    ids = sorted(set(run_ids))
    if not ids:
        return set()
    # The thread the receipt store writes in: the ORM never runs on the loop's own thread.
    return await sync_to_async(_requested_sync, thread_sensitive=True)(ids)


class _Watch:
    """The runs one event loop is running and the task that checks them for cancel requests."""

    def __init__(self) -> None:
        self.signals: dict[uuid.UUID, set[CancelSignal]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, run_id: uuid.UUID, signal: CancelSignal) -> None:
        self.signals.setdefault(run_id, set()).add(signal)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._check_periodically())

    def remove(self, run_id: uuid.UUID, signal: CancelSignal) -> None:
        held = self.signals.get(run_id)
        if held is None:
            return
        held.discard(signal)
        if not held:
            del self.signals[run_id]

    def fire(self, run_ids: Iterable[uuid.UUID]) -> None:
        for run_id in run_ids:
            for signal in list(self.signals.get(run_id, ())):
                signal.cancel(CANCEL_REASON)

    async def _check_periodically(self) -> None:
        try:
            while self.signals:
                await asyncio.sleep(check_interval())
                if not self.signals:
                    break
                try:
                    found = await cancel_requested(self.signals)
                except DatabaseError as error:
                    # The runs go on; the next check asks again.
                    logger.warning("could not check for cancel requests: %s", error)
                    continue
                self.fire(found)
        finally:
            # No await between the last look at `signals` and here: a run added meanwhile
            # would have found this task still set, so it is never left unwatched.
            self.task = None


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = weakref.WeakKeyDictionary()


def _watch() -> _Watch:
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = _Watch()
    return watch


def watched_runs() -> set[uuid.UUID]:
    """The runs this loop's watch holds (for tests and diagnostics)."""
    return set(_watch().signals)


def _lookup_sync(workspace_key: str, invocation_id: str) -> tuple[uuid.UUID | None, bool]:
    try:
        row = (
            EvaluationRun.objects.filter(workspace__key=workspace_key, invocation_id=invocation_id)
            .values_list("pk", "cancel_requested_at")
            .first()
        )
    except DatabaseError:
        close_old_connections()
        raise
    if row is None:
        return None, False
    return row[0], row[1] is not None


@contextlib.asynccontextmanager
async def run_cancel_signal(workspace_key: str, invocation_id: str) -> AsyncIterator[CancelSignal]:
    """The cancel signal of the evaluation run of `invocation_id` in `workspace_key`, while the
    block runs on this loop.

    It fires (reason `cancelled`) once the run's cancel request is seen: at once when it was
    requested before the block began, otherwise within one check interval. An evaluation with
    no run row (a harness or a test calling the engine) gets a signal that never fires.
    """
    signal = CancelSignal()
    try:
        run_id, requested = await sync_to_async(_lookup_sync, thread_sensitive=True)(
            workspace_key, invocation_id
        )
    except DatabaseError as error:
        # The evaluation's own receipt writes meet the same database; nothing to watch here.
        logger.warning("could not look up run %s for cancel requests: %s", invocation_id, error)
        run_id, requested = None, False
    if run_id is None:
        yield signal
        return
    if requested:
        signal.cancel(CANCEL_REASON)
    watch = _watch()
    watch.add(run_id, signal)
    try:
        yield signal
    finally:
        watch.remove(run_id, signal)
