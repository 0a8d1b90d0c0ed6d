"""Usage over time at size: the admin's usage page, the API's usage summary and the CSV export
over 30 days of hourly aggregates (and their daily roll-up) for 100 principals at 3 providers,
and what a day of them takes in the database.

Run:  DATABASE_URL=postgres://root@127.0.0.1:5432/sluice .venv/bin/python benchmarks/usage.py

It creates a throwaway test database next to the one DATABASE_URL names (SQLite when unset),
fills `UsageHour` with one row per hour, provider and principal for `--days` days (216 000 rows
for the defaults, the most a day can hold: every principal at every provider every hour) and
`UsageDay` with their sums (9 000 rows), then requests the page and the API summary for the
last 24 h, 7 d and 30 d (ranges over two days read days) and the CSV export through Django's
test client as a member of the workspace and reports p50/p95 of each. Figures only; no bounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import time

from django_setup import configure, throwaway_database

configure(SLUICE_ADMISSION_REDIS_URL="")

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from admission.models import Workspace, WorkspaceMembership  # noqa: E402
from evaluator.models import UsageDay, UsageHour  # noqa: E402
from evaluator.services.usage import usage_roll_up  # noqa: E402

REASONS = ("queue-full", "queue-timeout", "cost", "tokens")
DEFERRALS = ("concurrency", "tokens-per-second", "requests-per-minute")


def seed(days: int, principals: int, providers: int) -> tuple[Workspace, int]:
    workspace = Workspace.objects.create(key="bench", name="Bench")
    user = get_user_model().objects.create_user("bench-viewer", is_staff=True)
    WorkspaceMembership.objects.create(
        workspace=workspace, user=user, role=WorkspaceMembership.Role.VIEWER
    )
    rng = random.Random(7)
    end = timezone.now().replace(minute=0, second=0, microsecond=0)
    rows: list[UsageHour] = []
    day_rows: list[UsageHour] = []
    count = 0
    for hour_index in range(days * 24):
        hour = end - dt.timedelta(hours=hour_index)
        if day_rows and hour.date() != day_rows[-1].hour.date():
            UsageDay.objects.bulk_create(usage_roll_up(day_rows))
            day_rows = []
        for provider in range(providers):
            for principal in range(principals):
                calls = rng.randint(1, 40)
                refused = rng.randint(0, 3)
                deferred = rng.randint(0, calls)
                row = UsageHour(
                    workspace=workspace,
                    hour=hour,
                    provider_id=f"provider-{provider}",
                    principal_id=f"principal-{principal:03d}",
                    runs=max(1, calls // 4),
                    calls=calls,
                    tokens=calls * rng.randint(200, 2000),
                    cost_usd=calls * rng.random() * 0.01,
                    admitted=calls,
                    deferred=deferred,
                    deferred_by_reason={rng.choice(DEFERRALS): deferred} if deferred else {},
                    refused=refused,
                    refused_by_reason={rng.choice(REASONS): refused} if refused else {},
                    queue_delay_ms_sum=calls * rng.random() * 200,
                    queue_delay_ms_max=rng.random() * 2000,
                )
                rows.append(row)
                day_rows.append(row)
        if len(rows) >= 20_000:
            UsageHour.objects.bulk_create(rows)
            count += len(rows)
            rows = []
    UsageHour.objects.bulk_create(rows)
    UsageDay.objects.bulk_create(usage_roll_up(day_rows))
    count += len(rows)
    return workspace, count


def storage_bytes(table: str) -> int | None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SELECT pg_total_relation_size('{table}')")
            return int(cursor.fetchone()[0])
        if connection.vendor == "sqlite":
            try:
                cursor.execute(
                    "SELECT SUM(pgsize) FROM dbstat WHERE name = %s OR tbl_name = %s",
                    [table, table],
                )
            except Exception:
                return None
            return int(cursor.fetchone()[0] or 0)
    return None


def timed(client: Client, path: str, repeat: int) -> tuple[list[float], int]:
    first = client.get(path)
    if first.status_code != 200:
        raise SystemExit(f"{path} answered {first.status_code}: {first.content[:300]!r}")
    size = len(b"".join(first.streaming_content) if first.streaming else first.content)
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path)
        if response.streaming:
            b"".join(response.streaming_content)
        timings.append((time.perf_counter() - started) * 1000)
    return sorted(timings), size


def report(name: str, timings: list[float], size: int) -> None:
    p95 = timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))]
    print(
        f"{name}: {size:,} bytes, {len(timings)} requests, p50 "
        f"{statistics.median(timings):.1f} ms, p95 {p95:.1f} ms, max {timings[-1]:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--principals", type=int, default=100)
    parser.add_argument("--providers", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with throwaway_database():
        started = time.perf_counter()
        workspace, rows = seed(args.days, args.principals, args.providers)
        seeded = time.perf_counter() - started
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("VACUUM ANALYZE evaluator_usagehour")
                cursor.execute("VACUUM ANALYZE evaluator_usageday")
        days = UsageDay.objects.count()
        print(
            f"usage on {connection.vendor}: {rows:,} hourly rows and {days:,} daily rows "
            f"({args.days} days x {args.principals} principals x {args.providers} providers), "
            f"seeded in {seeded:.1f} s"
        )
        for table, count in (("evaluator_usagehour", rows), ("evaluator_usageday", days)):
            size = storage_bytes(table)
            if size is not None:
                print(
                    f"storage of {table}: {size / 1e6:.1f} MB with indexes, "
                    f"{size / args.days / 1e6:.3f} MB per day, {size / count:.0f} bytes per row"
                )
        client = Client()
        client.force_login(get_user_model().objects.get(username="bench-viewer"))
        key = workspace.key
        for label, path in (
            ("usage page, last 24h", f"/admin/usage/?workspace={key}&range=24h"),
            ("usage page, last 7d", f"/admin/usage/?workspace={key}&range=7d"),
            ("usage page, last 30d", f"/admin/usage/?workspace={key}&range=30d"),
            ("API summary, last 24h", f"/api/workspaces/{key}/usage/?range=24h"),
            ("API summary, last 7d", f"/api/workspaces/{key}/usage/?range=7d"),
            ("API summary, last 30d", f"/api/workspaces/{key}/usage/?range=30d"),
            ("CSV export, last 24h", f"/api/workspaces/{key}/usage.csv?range=24h"),
        ):
            timings, body = timed(client, path, args.repeat)
            report(f"GET {label}", timings, body)


if __name__ == "__main__":
    main()
