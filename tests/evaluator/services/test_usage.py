"""Hourly usage aggregates (evaluator/services/usage.py): a finishing run's attempts add up per
hour, provider and principal, exactly once; totals, series and the CSV export read them back;
old hours go after the retention."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.db import transaction
from django.utils import timezone

from admission.models import Workspace
from evaluator.models import EvaluationRun, UsageHour
from evaluator.services import runs as services
from evaluator.services import usage

pytestmark = pytest.mark.django_db


def attempt(provider: str, *, sent=True, tokens=None, cost=None, decision="admit", **extra):
    evidence = {"decision": decision, "reason": extra.pop("reason", "admitted")}
    evidence["queueDelayMs"] = extra.pop("delay", 0.0)
    doc = {"adapterId": provider, "sent": sent, "evidence": evidence, **extra}
    if tokens is not None:
        doc["tokens"] = tokens
    if cost is not None:
        doc["costUsd"] = cost
    return doc


@pytest.fixture
def acme(django_user_model):
    user = django_user_model.objects.create_user("uma")
    workspace = Workspace.objects.create(key="acme", name="Acme")
    return workspace, user


def finish(workspace, user, principal, attempts, *, at=None, index=[0]):  # noqa: B006
    index[0] += 1
    run = EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=user,
        principal_id=principal,
        invocation_id=f"inv-{index[0]}",
        document={},
        status="running",
    )
    finished = services.run_finish(run, status="completed", attempts=attempts)
    if at is not None:
        # The run finished at another hour: move its usage there for the test.
        EvaluationRun.objects.filter(pk=run.pk).update(finished_at=at)
    return finished


def test_a_runs_attempts_add_up_per_hour_provider_and_principal_exactly_once(acme):
    workspace, user = acme
    run = finish(
        workspace,
        user,
        "pat",
        [
            attempt("openai", tokens=120, cost=0.0024),
            attempt("openai", tokens=80, cost=0.0016, delay=350.0),
            attempt("openai", sent=False, decision="reject", reason="queue-full"),
            attempt("openai", sent=False, decision="reject", reason="budget"),
            attempt("backup", tokens=15),  # no price known
            attempt("backup", sent=True, tokens=None),  # unknown tokens, unpriced
        ],
    )
    # Finishing again changes nothing: the run counted when it finished.
    assert services.run_finish(run, status="completed", attempts=run.attempts) == run
    rows = {r.provider_id: r for r in UsageHour.objects.all()}
    assert set(rows) == {"openai", "backup"}
    openai = rows["openai"]
    assert openai.hour == timezone.now().replace(minute=0, second=0, microsecond=0)
    assert (openai.principal_id, openai.runs, openai.calls, openai.tokens) == ("pat", 1, 2, 200)
    assert openai.cost_usd == pytest.approx(0.004)
    assert (openai.admitted, openai.deferred, openai.refused) == (2, 1, 2)
    assert openai.refused_by_reason == {"queue-full": 1, "budget": 1}
    assert (openai.queue_delay_ms_sum, openai.queue_delay_ms_max) == (350.0, 350.0)
    backup = rows["backup"]
    assert (backup.calls, backup.tokens, backup.cost_usd, backup.unpriced_calls) == (2, 15, 0, 2)

    finish(workspace, user, "pat", [attempt("openai", tokens=5, cost=0.5, delay=20.0)])
    finish(workspace, user, "alex", [attempt("openai", tokens=7, cost=0.25)])
    openai.refresh_from_db()
    assert (openai.runs, openai.calls, openai.tokens, openai.cost_usd) == (2, 3, 205, 0.5040)
    assert (openai.queue_delay_ms_sum, openai.queue_delay_ms_max) == (370.0, 350.0)
    assert UsageHour.objects.count() == 3


def test_totals_series_and_csv_read_the_hours_back(acme):
    workspace, user = acme
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for principal, tokens, cost in (("pat", 100, 0.1), ("alex", 40, 0.3), ("pat", 10, 0.01)):
        finish(workspace, user, principal, [attempt("openai", tokens=tokens, cost=cost)])
    finish(
        workspace,
        user,
        "alex",
        [attempt("openai", sent=False, decision="reject", reason="queue-full")],
    )
    old = UsageHour.objects.create(
        workspace=workspace,
        hour=now - dt.timedelta(hours=3),
        provider_id="openai",
        principal_id="pat",
        calls=1,
        tokens=1,
        cost_usd=1 / 3,
    )
    start, end = now - dt.timedelta(hours=5), now + dt.timedelta(hours=1)
    rows = usage.usage_hours(workspace, start, end)
    by_principal = {t.key: t for t in usage.usage_totals(rows, "principal_id")}
    assert (by_principal["pat"].calls, by_principal["pat"].tokens) == (3, 111)
    assert by_principal["alex"].refused == 1 and by_principal["alex"].cost_usd == 0.3
    (whole,) = usage.usage_totals(rows)
    assert (whole.calls, whole.tokens, whole.refused) == (4, 151, 1)
    assert usage.usage_totals(usage.usage_hours(workspace, end, end)) == []

    series = usage.usage_series(rows, start, end)
    assert [h["hour"] for h in series["hours"]] == [start + dt.timedelta(hours=i) for i in range(6)]
    assert [h["calls"] for h in series["hours"]] == [0, 0, 1, 0, 0, 3]
    assert series["refused_by_reason"] == {"queue-full": 1}

    text = "".join(usage.usage_csv(rows))
    read = list(csv.DictReader(io.StringIO(text)))
    assert tuple(read[0]) == usage.CSV_COLUMNS and len(read) == 3
    first = read[0]
    assert first["hour"] == (now - dt.timedelta(hours=3)).isoformat().replace("+00:00", "Z")
    # Full precision: the cost reads back as the very float stored.
    assert float(first["cost_usd"]) == old.cost_usd
    assert json.loads(read[1]["refused_by_reason"]) == {"queue-full": 1}

    # Another workspace's rows are not this one's.
    other = Workspace.objects.create(key="globex", name="Globex")
    assert not usage.usage_hours(other, start, end).exists()


def test_hours_older_than_the_retention_are_removed(acme, settings):
    workspace, _ = acme
    settings.SLUICE_USAGE_RETENTION_DAYS = 2
    now = timezone.now()
    for days in (0, 1, 2, 3):
        UsageHour.objects.create(
            workspace=workspace,
            hour=(now - dt.timedelta(days=days)).replace(minute=0, second=0, microsecond=0),
            provider_id="p",
            principal_id="x",
        )
    with transaction.atomic():
        assert usage.usage_prune(now) == 1
    assert UsageHour.objects.count() == 3
