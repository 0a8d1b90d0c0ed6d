"""Celery tasks: thin, take a run id, safe to run twice.

`run_evaluation` is a doorbell: the run's state is its database row, and the message only tells
this worker process's runner (evaluator/worker/runner.py) to look at the backlog now. It stores no
result and is acknowledged at once; a lost doorbell costs one poll interval, never the run.
Load runs are executed by their task (`acks_late` with `reject_on_worker_lost`).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import DatabaseError

from evaluator.services import runs as services
from evaluator.worker.runner import current_runner

# A database that is busy or restarting: deliver again shortly; the services resume the run.
_RETRY = {
    "autoretry_for": (DatabaseError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": 8,
}


@shared_task(name="evaluator.run_evaluation", acks_late=False, ignore_result=True)
def run_evaluation(run_id: str) -> None:
    """Wake this process's runner: a run was queued (it claims fairly, not this run first)."""
    runner = current_runner()
    if runner is not None:
        runner.wake()


@shared_task(
    name="evaluator.run_load_manifest", acks_late=True, reject_on_worker_lost=True, **_RETRY
)
def run_load_manifest(run_id: str) -> dict[str, Any]:
    """Execute one load harness run."""
    run = services.load_run_execute(run_id)
    return {"run": run_id, "status": run.status if run is not None else "missing"}
