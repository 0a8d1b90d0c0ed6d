"""The Celery app, as in Celery's Django example: settings under CELERY_*, tasks autodiscovered.

Embedded default: the filesystem broker under var/broker (no server). With CELERY_BROKER_URL
set, Redis or RabbitMQ. Results go to django-celery-results either way.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# `filesystem://` means the embedded broker whose messages appear whole (config/broker.py).
TRANSPORT_ALIASES["filesystem"] = "config.broker:Transport"

logger = logging.getLogger(__name__)

app = Celery("sluice")
# Queue name and broker options come from config/settings.py (CELERY_* settings).
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.on_after_configure.connect
def _broker_folders(sender: Celery, **_: Any) -> None:
    # Once the settings are read, not at import: importing `config` must not need them yet
    # (the demo launcher, `python -m config.cli`, prepares the environment first).
    if str(sender.conf.broker_url).startswith("filesystem://"):
        options = dict(sender.conf.broker_transport_options or {})
        for key in ("data_folder_in", "data_folder_out", "control_folder", "processed_folder"):
            if key in options:
                Path(options[key]).mkdir(parents=True, exist_ok=True)


app.autodiscover_tasks()


@worker_process_init.connect
def _fresh_process_state(**_: Any) -> None:
    # A forked pool child owns no registry, loop or listener thread of the parent's.
    from admission.runtime import refresh
    from admission.runtime import registry as runtime
    from evaluator.worker.loop import evaluation_loop, reset_evaluation_loop

    runtime.reset_registry()
    reset_evaluation_loop()
    refresh.reset_after_fork()
    refresh.start_listener(evaluation_loop().frozen)


@worker_process_shutdown.connect
def _stop_listener(**_: Any) -> None:
    from admission.runtime import refresh

    refresh.stop_listener()


@worker_ready.connect
def _start_runner(**_: Any) -> None:
    # The worker's own process claims and runs evaluations (evaluator/worker/runner.py); the thread
    # pool only carries doorbells into it.
    from config.telemetry import evaluator_telemetry
    from evaluator.worker import execute
    from evaluator.worker.dispatch import WorkerRefused
    from evaluator.worker.runner import start_runner

    # Evaluations record into this process's telemetry providers (none when export is off).
    execute.use_telemetry(evaluator_telemetry)
    try:
        start_runner()
    except WorkerRefused as refused:
        logger.critical("this worker refuses to run evaluations: %s", refused)
        os.kill(os.getpid(), signal.SIGTERM)


@worker_shutdown.connect
def _stop_runner(**_: Any) -> None:
    from evaluator.worker.runner import stop_runner

    stop_runner()


@worker_ready.connect
def _expire_old_results(**_: Any) -> None:
    # Beat runs the same clean-up daily where it is deployed; a starting worker does it once,
    # so a deployment without beat (the embedded one) does not keep every result forever.
    from django.db import connections

    try:
        app.backend.cleanup()
    finally:
        connections.close_all()
