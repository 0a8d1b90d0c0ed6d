"""Usage aggregates (evaluator/services/usage.py): a finishing run's attempts add up per hour,
provider and principal, exactly once, with the deferrals and refusals by reason; every day row
is the sum of its hours; totals, series and the CSV export read them back, long ranges day by
day with the same sums; old days and their hours go after the retention."""

from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import io
import json
import random
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from admission.models import Workspace
from evaluator.models import EvaluationRun, UsageDay, UsageHour
from evaluator.services import runs as services
from evaluator.services import usage

pytestmark = pytest.mark.django_db


def attempt(provider: str, *, sent=True, tokens=None, cost=None, decision="admit", **extra):
    evidence = {"decision": decision, "reason": extra.pop("reason", "admitted")}
    evidence["queueDelayMs"] = extra.pop("delay", 0.0)
    deferred_by = extra.pop("deferred_by", None)
    doc = {"adapterId": provider, "sent": sent, "evidence": evidence, **extra}
    if deferred_by is not None:
        doc["deferredBy"] = deferred_by
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
            attempt("openai", tokens=80, cost=0.0016, delay=350.0, deferred_by=["concurrency"]),
            attempt(
                "openai",
                sent=False,
                decision="reject",
                reason="queue-timeout",
                delay=900.0,
                deferred_by=["concurrency", "tokens-per-second"],
            ),
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
    assert (openai.admitted, openai.deferred, openai.refused) == (2, 2, 3)
    assert openai.deferred_by_reason == {"concurrency": 2, "tokens-per-second": 1}
    assert openai.refused_by_reason == {"queue-full": 1, "budget": 1, "queue-timeout": 1}
    assert (openai.queue_delay_ms_sum, openai.queue_delay_ms_max) == (350.0, 350.0)
    backup = rows["backup"]
    assert (backup.calls, backup.tokens, backup.cost_usd, backup.unpriced_calls) == (2, 15, 0, 2)

    # An attempt recorded before deferral reasons were kept, that waited: reason unrecorded.
    finish(workspace, user, "pat", [attempt("openai", tokens=5, cost=0.5, delay=20.0)])
    finish(workspace, user, "alex", [attempt("openai", tokens=7, cost=0.25)])
    openai.refresh_from_db()
    assert (openai.runs, openai.calls, openai.tokens, openai.cost_usd) == (2, 3, 205, 0.5040)
    assert (openai.queue_delay_ms_sum, openai.queue_delay_ms_max) == (370.0, 350.0)
    assert openai.deferred_by_reason == {
        "concurrency": 2,
        "tokens-per-second": 1,
        usage.UNRECORDED: 1,
    }
    assert UsageHour.objects.count() == 3
    assert_days_are_the_sums_of_their_hours()


SUMMED = (
    "runs",
    "calls",
    "tokens",
    "unpriced_calls",
    "admitted",
    "deferred",
    "refused",
)


def assert_days_are_the_sums_of_their_hours():
    """Every UsageDay row equals the sum of its day's UsageHour rows, and no hour lacks one."""
    days = {
        (d.workspace_id, d.day, d.provider_id, d.principal_id): d for d in UsageDay.objects.all()
    }
    summed: dict = {}
    for hour in UsageHour.objects.all():
        day = hour.hour.replace(hour=0)
        key = (hour.workspace_id, day, hour.provider_id, hour.principal_id)
        into = summed.setdefault(
            key,
            {"cost": 0.0, "delay": 0.0, "max": 0.0, "deferred_by": {}, "refused_by": {}}
            | {name: 0 for name in SUMMED},
        )
        for name in SUMMED:
            into[name] += getattr(hour, name)
        into["cost"] += hour.cost_usd
        into["delay"] += hour.queue_delay_ms_sum
        into["max"] = max(into["max"], hour.queue_delay_ms_max)
        for mine, theirs in (
            ("deferred_by", hour.deferred_by_reason),
            ("refused_by", hour.refused_by_reason),
        ):
            for reason, n in theirs.items():
                into[mine][reason] = into[mine].get(reason, 0) + n
    assert set(days) == set(summed)
    for key, sums in summed.items():
        day = days[key]
        assert {name: getattr(day, name) for name in SUMMED} == {n: sums[n] for n in SUMMED}, key
        assert day.cost_usd == pytest.approx(sums["cost"], rel=1e-12)
        assert day.queue_delay_ms_sum == pytest.approx(sums["delay"], rel=1e-12)
        assert day.queue_delay_ms_max == sums["max"]
        assert day.deferred_by_reason == sums["deferred_by"]
        assert day.refused_by_reason == sums["refused_by"]


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
    assert series["granularity"] == "hour"
    assert [p["start"] for p in series["points"]] == [
        start + dt.timedelta(hours=i) for i in range(6)
    ]
    assert [p["calls"] for p in series["points"]] == [0, 0, 1, 0, 0, 3]
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


def record(workspace, principal, attempts, at):
    """A run of `principal` that finished at `at` with these attempts, counted."""
    run = EvaluationRun(
        workspace=workspace, principal_id=principal, attempts=attempts, finished_at=at
    )
    with transaction.atomic():
        usage.usage_record_run(run)


def seeded_week(workspace, now):
    """Runs at random hours of the last six days: some deferred, some refused."""
    rng = random.Random(11)
    for _ in range(160):
        at = now - dt.timedelta(minutes=rng.randrange(6 * 24 * 60))
        attempts = []
        for _ in range(rng.randint(1, 4)):
            provider = rng.choice(["openai", "backup"])
            roll = rng.random()
            if roll < 0.2:
                attempts.append(
                    attempt(
                        provider,
                        sent=False,
                        decision="reject",
                        reason=rng.choice(["queue-full", "queue-timeout"]),
                        delay=rng.choice([0.0, 120.5]),
                        deferred_by=rng.choice([[], ["concurrency"]]),
                    )
                )
            else:
                waited = roll > 0.6
                attempts.append(
                    attempt(
                        provider,
                        tokens=rng.randint(10, 900),
                        cost=rng.random() / 7,
                        delay=rng.random() * 400 if waited else 0.0,
                        deferred_by=rng.sample(["concurrency", "tokens-per-second"], 1)
                        if waited
                        else [],
                    )
                )
        record(workspace, rng.choice(["pat", "alex", "sam"]), attempts, at)


def assert_same_totals(mine, theirs):
    assert [t.key for t in mine] == [t.key for t in theirs]
    for a, b in zip(mine, theirs, strict=True):
        for name in ("runs", "calls", "tokens", "admitted", "deferred", "refused"):
            assert getattr(a, name) == getattr(b, name), (a.key, name)
        assert a.cost_usd == pytest.approx(b.cost_usd, rel=1e-9)
        assert a.queue_delay_ms_sum == pytest.approx(b.queue_delay_ms_sum, rel=1e-9)
        assert a.queue_delay_ms_max == b.queue_delay_ms_max


def test_long_ranges_read_days_with_the_same_sums_as_the_hours(acme):
    workspace, _ = acme
    now = timezone.now()
    seeded_week(workspace, now)
    assert_days_are_the_sums_of_their_hours()
    assert UsageDay.objects.count() < UsageHour.objects.count()

    current = now.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    for span, end in (
        (dt.timedelta(days=7), current),
        (dt.timedelta(days=3, hours=5), current - dt.timedelta(hours=30)),
        (dt.timedelta(days=2, hours=1), current - dt.timedelta(hours=7)),
    ):
        start = end - span
        rows = usage.usage_rows(workspace, start, end)
        assert rows.granularity == "day" and rows.days is not None
        hours = usage.usage_hours(workspace, start, end)
        for by in (None, "provider_id", "principal_id"):
            assert_same_totals(usage.usage_totals(rows, by), usage.usage_totals(hours, by))
        one = usage.usage_rows(workspace, start, end, provider="backup", principal="sam")
        assert_same_totals(
            usage.usage_totals(one),
            usage.usage_totals(
                usage.usage_hours(workspace, start, end, provider="backup", principal="sam")
            ),
        )
        assert usage.usage_reasons(rows) == usage.usage_reasons(hours)
        assert usage.usage_reasons(rows)["deferred"]["concurrency"] > 0

        daily = usage.usage_series(rows, start, end)
        hourly = usage.usage_series(hours, start, end)
        assert daily["granularity"] == "day"
        first = start.replace(hour=0)
        assert [p["start"] for p in daily["points"]] == [
            first + dt.timedelta(days=i) for i in range(len(daily["points"]))
        ]
        assert (
            daily["points"][-1]["start"]
            < end
            <= daily["points"][-1]["start"] + dt.timedelta(days=1)
        )
        for point in daily["points"]:
            inside = [
                p
                for p in hourly["points"]
                if point["start"] <= p["start"] < point["start"] + dt.timedelta(days=1)
            ]
            for name in ("calls", "tokens", "admitted", "deferred", "refused"):
                assert point[name] == sum(p[name] for p in inside), (point["start"], name)
            assert point["cost_usd"] == pytest.approx(sum(p["cost_usd"] for p in inside))

    # Two days or less: hour by hour.
    assert usage.usage_rows(workspace, current - dt.timedelta(days=2), current).days is None


def test_pruning_removes_whole_days_and_keeps_days_and_hours_in_step(acme, settings):
    workspace, _ = acme
    now = timezone.now()
    seeded_week(workspace, now)
    settings.SLUICE_USAGE_RETENTION_DAYS = 3
    cutoff_day = (now - dt.timedelta(days=3)).replace(hour=0, minute=0, second=0, microsecond=0)
    before = UsageHour.objects.filter(hour__lt=cutoff_day).count()
    before += UsageDay.objects.filter(day__lt=cutoff_day).count()
    assert before > 0
    assert usage.usage_prune(now) == before
    assert not UsageHour.objects.filter(hour__lt=cutoff_day).exists()
    assert UsageHour.objects.filter(hour__lt=cutoff_day + dt.timedelta(hours=6)).exists()
    assert_days_are_the_sums_of_their_hours()


@pytest.fixture
def usage_benchmark(monkeypatch):
    """benchmarks/usage.py as a module, in this test's Django: its own set-up is skipped."""
    benchmarks = Path(__file__).resolve().parents[3] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    monkeypatch.setattr(importlib.import_module("django_setup"), "configure", lambda **_: None)
    spec = importlib.util.spec_from_file_location("usage_benchmark", benchmarks / "usage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def figures(row):
    return {
        name: getattr(row, name) for name in (*SUMMED, "deferred_by_reason", "refused_by_reason")
    } | {
        name: pytest.approx(getattr(row, name), rel=1e-12)
        for name in ("cost_usd", "queue_delay_ms_sum", "queue_delay_ms_max")
    }


def test_the_usage_benchmark_seeds_days_that_are_the_roll_up_of_its_hours(usage_benchmark):
    workspace, hours = usage_benchmark.seed(days=2, principals=2, providers=2)
    assert hours == UsageHour.objects.count() == 2 * 24 * 2 * 2
    stored = {
        (d.day, d.provider_id, d.principal_id): d
        for d in UsageDay.objects.filter(workspace=workspace)
    }
    rolled = {
        (d.day, d.provider_id, d.principal_id): d
        for d in usage.usage_roll_up(UsageHour.objects.filter(workspace=workspace))
    }
    # 48 hours ending with the current one reach into three UTC days, or two at 23h.
    assert len({day for day, _, _ in rolled}) in (2, 3)
    assert set(stored) == set(rolled)
    for key, day in rolled.items():
        assert figures(stored[key]) == figures(day), key
    assert_days_are_the_sums_of_their_hours()
