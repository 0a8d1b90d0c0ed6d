"""Celery tasks: thin, take a run id, call a service, safe to run twice.

`acks_late` with `reject_on_worker_lost`: a worker that dies mid-run leaves the message on the
broker, and the next delivery resumes the run from its database receipt.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import DatabaseError

from evaluator import services

# A database that is busy or restarting: deliver again shortly; the services resume the run.
_RETRY = {
    "autoretry_for": (DatabaseError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": 8,
}


@shared_task(name="evaluator.run_evaluation", acks_late=True, reject_on_worker_lost=True, **_RETRY)
def run_evaluation(run_id: str) -> dict[str, Any]:
    """Execute (or resume) one evaluation run."""
    run = services.evaluation_run_execute(run_id)
    return {"run": run_id, "status": run.status if run is not None else "missing"}


@shared_task(
    name="evaluator.run_load_manifest", acks_late=True, reject_on_worker_lost=True, **_RETRY
)
def run_load_manifest(run_id: str) -> dict[str, Any]:
    """Execute one load harness run."""
    run = services.load_run_execute(run_id)
    return {"run": run_id, "status": run.status if run is not None else "missing"}
