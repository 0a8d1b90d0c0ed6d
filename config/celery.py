"""The Celery app, as in Celery's Django example: settings under CELERY_*, tasks autodiscovered.

Embedded default: the filesystem broker under var/broker (no server). With CELERY_BROKER_URL
set, Redis or RabbitMQ. Results go to django-celery-results either way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("sluice")
app.config_from_object("django.conf:settings", namespace="CELERY")

# A queue name of its own lets several deployments (and test runs) share one Redis.
app.conf.task_default_queue = os.environ.get("SLUICE_CELERY_QUEUE", "sluice")


@app.on_after_configure.connect
def _broker_transport_options(sender: Celery, **_: Any) -> None:
    # Once the settings are read, not at import: importing `config` must not need them yet
    # (the demo launcher, `python -m config.cli`, prepares the environment first).
    options: dict[str, Any] = dict(sender.conf.broker_transport_options or {})
    broker_url = str(sender.conf.broker_url)
    if broker_url.startswith("filesystem://"):
        for key in ("data_folder_in", "data_folder_out", "control_folder", "processed_folder"):
            if key in options:
                Path(options[key]).mkdir(parents=True, exist_ok=True)
        # The default one-second poll would put a second on every submit-to-start.
        options.setdefault(
            "polling_interval", float(os.environ.get("SLUICE_BROKER_POLL_SECONDS", "0.05"))
        )
    elif broker_url.startswith(("redis://", "rediss://")):
        # An unacknowledged message goes back to the queue after this long; it must outlast the
        # longest evaluation, or a slow run would be delivered twice (the receipt stops the
        # second).
        visibility = int(os.environ.get("SLUICE_BROKER_VISIBILITY_TIMEOUT", "3600"))
        options.setdefault("visibility_timeout", visibility)
        # Sweep for abandoned messages often enough that the timeout, not the sweep, decides.
        options.setdefault("unacked_restore_interval", max(1, min(10, visibility // 5)))
        options.setdefault("unacked_restore_throttle", 1)
    sender.conf.broker_transport_options = options


app.autodiscover_tasks()


@worker_process_init.connect
def _fresh_process_state(**_: Any) -> None:
    # A forked pool child owns no registry, loop or listener thread of the parent's.
    from admission import refresh, runtime
    from evaluator.worker import evaluation_loop, reset_evaluation_loop

    runtime.reset_registry()
    reset_evaluation_loop()
    refresh.reset_after_fork()
    refresh.start_listener(evaluation_loop().frozen)


@worker_process_shutdown.connect
def _stop_listener(**_: Any) -> None:
    from admission import refresh

    refresh.stop_listener()


@worker_ready.connect
def _requeue_orphaned_runs(**_: Any) -> None:
    # Redis and RabbitMQ redeliver an unacknowledged message themselves; the filesystem broker
    # does not, so runs its dead worker held are queued again here.
    if not str(app.conf.broker_url).startswith("filesystem://"):
        return
    from django.db import connections

    from evaluator import services

    try:
        services.runs_requeue_orphaned()
    finally:
        connections.close_all()
