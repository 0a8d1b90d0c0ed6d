"""Publishing a run's Celery message by task name, so the services never import the tasks.

A doorbell only tells a worker to look at the backlog now; the run's row is the queue entry.
Hooks registered with `before_ring` run before each doorbell is published (a test holds one
there to stop the web process between commit and publish).
"""

from __future__ import annotations

from collections.abc import Callable

from celery import current_app

__all__ = ["PUBLISH_RETRY_POLICY", "RUN_EVALUATION", "before_ring", "ring"]

# Task names: the messages are routed by these (evaluator/tasks.py declares them).
RUN_EVALUATION = "evaluator.run_evaluation"

# A dead broker answers within about a second instead of the default retry schedule.
PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.25,
    "interval_max": 0.5,
}

_before_ring: list[Callable[[], None]] = []


def before_ring(hook: Callable[[], None]) -> Callable[[], None]:
    """Call `hook()` before every doorbell this process publishes; returns its remover."""
    _before_ring.append(hook)
    return lambda: _before_ring.remove(hook)


def ring(run_id: str, task_id: str) -> None:
    """Publish the doorbell of run `run_id` (raises whatever the broker's transport raises)."""
    for hook in list(_before_ring):
        hook()
    current_app.send_task(
        RUN_EVALUATION,
        args=[run_id],
        task_id=task_id,
        retry=True,
        retry_policy=PUBLISH_RETRY_POLICY,
    )
