"""Celery tasks: thin, take a run id, safe to run twice.

`run_evaluation` is a doorbell: the run's state is its database row, and the message only tells
this worker process's runner (evaluator/worker/runner.py) to look at the backlog now. It stores no
result and is acknowledged at once; a lost doorbell costs one poll interval, never the run.
Load runs are queued and claimed the same way (evaluator/worker/load_dispatch.py).
"""

from __future__ import annotations

from celery import shared_task

from evaluator.worker.runner import current_runner


@shared_task(name="evaluator.run_evaluation", acks_late=False, ignore_result=True)
def run_evaluation(run_id: str) -> None:
    """Wake this process's runner: a run was queued (it claims fairly, not this run first)."""
    runner = current_runner()
    if runner is not None:
        runner.wake()


@shared_task(name="evaluator.run_load_manifest", acks_late=False, ignore_result=True)
def run_load_manifest(run_id: str) -> None:
    """A doorbell for load runs, kept for messages published before load runs travelled
    through the database: it wakes this process's runner like `run_evaluation`."""
    runner = current_runner()
    if runner is not None:
        runner.wake()
