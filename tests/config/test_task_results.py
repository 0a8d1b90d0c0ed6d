"""Task result rows expire: Celery's own clean-up task deletes rows older than the setting."""

from __future__ import annotations

import datetime as dt

import pytest
from celery.signals import worker_ready
from django.conf import settings
from django.utils import timezone
from django_celery_results.models import TaskResult

from config.celery import app
from evaluator.worker.runner import stop_runner

pytestmark = pytest.mark.django_db


def test_result_rows_older_than_the_expiry_are_cleaned_up():
    assert settings.CELERY_RESULT_EXPIRES == 86_400
    assert app.conf.result_expires == 86_400
    now = timezone.now()
    ages = {"old": dt.timedelta(days=2), "edge": dt.timedelta(hours=23), "new": dt.timedelta()}
    for task_id, age in ages.items():
        row = TaskResult.objects.create(task_id=task_id, status="SUCCESS")
        # date_done is set on save; age the row afterwards, as time would.
        TaskResult.objects.filter(pk=row.pk).update(date_done=now - age)
    # What celery beat runs daily; applied here in this process, against the test database.
    app.tasks["celery.backend_cleanup"].apply().get()
    assert set(TaskResult.objects.values_list("task_id", flat=True)) == {"edge", "new"}


@pytest.mark.django_db(transaction=True)  # the handler closes the process's connections
def test_a_starting_worker_cleans_up_once():
    now = timezone.now()
    row = TaskResult.objects.create(task_id="stale", status="SUCCESS")
    TaskResult.objects.filter(pk=row.pk).update(date_done=now - dt.timedelta(days=3))
    try:
        worker_ready.send(sender=None)
    finally:
        # A starting worker also starts its evaluation runner (evaluator/worker/runner.py).
        stop_runner()
    assert not TaskResult.objects.filter(task_id="stale").exists()
