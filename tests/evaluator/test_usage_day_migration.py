"""Migration 0010: the hours stored before daily usage existed are rolled up into their days,
each day the sum of its hours."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("evaluator", "0009_receipt_schema_v3")]
AFTER = [("evaluator", "0010_usage_days_and_deferral_reasons")]


def test_migration_rolls_the_stored_hours_up_into_days():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    workspace = apps.get_model("admission", "Workspace").objects.create(key="acme", name="Acme")
    hours = apps.get_model("evaluator", "UsageHour")
    day = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    for at, principal, calls, cost, reasons, delay_max in (
        (day + dt.timedelta(hours=1), "pat", 3, 0.1, {"queue-full": 1}, 10.0),
        (day + dt.timedelta(hours=23), "pat", 4, 0.2, {"queue-full": 2, "cost": 1}, 30.0),
        (day + dt.timedelta(hours=24), "pat", 5, 0.4, {}, 5.0),
        (day + dt.timedelta(hours=2), "alex", 7, 1 / 3, {}, 0.0),
    ):
        hours.objects.create(
            workspace=workspace,
            hour=at,
            provider_id="openai",
            principal_id=principal,
            runs=1,
            calls=calls,
            tokens=calls * 10,
            cost_usd=cost,
            admitted=calls,
            deferred=1,
            refused=sum(reasons.values()),
            refused_by_reason=reasons,
            queue_delay_ms_sum=delay_max,
            queue_delay_ms_max=delay_max,
        )
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    try:
        days = executor.loader.project_state(AFTER).apps.get_model("evaluator", "UsageDay")
        found = {(d.day, d.principal_id): d for d in days.objects.all()}
        assert set(found) == {(day, "pat"), (day + dt.timedelta(days=1), "pat"), (day, "alex")}
        first = found[(day, "pat")]
        assert (first.runs, first.calls, first.tokens, first.admitted, first.deferred) == (
            2,
            7,
            70,
            7,
            2,
        )
        assert first.cost_usd == pytest.approx(0.3)
        assert first.refused == 4 and first.refused_by_reason == {"queue-full": 3, "cost": 1}
        assert (first.queue_delay_ms_sum, first.queue_delay_ms_max) == (40.0, 30.0)
        assert found[(day + dt.timedelta(days=1), "pat")].calls == 5
        assert found[(day, "alex")].cost_usd == 1 / 3
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
