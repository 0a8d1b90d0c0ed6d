"""Usage over time: hourly aggregates per workspace, provider and principal.

When an evaluation run finishes, `usage_record_run` adds its attempts to the `UsageHour` rows of
the hour it finished, in the transaction that finishes it (so a run counts once): calls sent,
the actual tokens and cost that were reconciled with admission on release, admitted, deferred
(admitted after waiting) and refused attempts with the refusal reasons, and the admitted queue
delay. Rows older than `SLUICE_USAGE_RETENTION_DAYS` are removed. The selectors below read them
for the admin's usage page, the REST API and the CSV export.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Max, QuerySet, Sum
from django.utils import timezone

from admission.models import Workspace
from evaluator.models import EvaluationRun, UsageHour

__all__ = [
    "CSV_COLUMNS",
    "UsageTotals",
    "usage_csv",
    "usage_hours",
    "usage_prune",
    "usage_record_run",
    "usage_series",
    "usage_totals",
    "usage_totals_summed",
]

CSV_COLUMNS = (
    "hour",
    "provider",
    "principal",
    "runs",
    "calls",
    "tokens",
    "cost_usd",
    "unpriced_calls",
    "admitted",
    "deferred",
    "refused",
    "refused_by_reason",
    "queue_delay_ms_sum",
    "queue_delay_ms_max",
)
_PRUNE_EVERY_SECONDS = 3600.0
_pruned_at = 0.0
_prune_lock = threading.Lock()


def _hour(at: datetime) -> datetime:
    return at.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


@dataclass
class _Usage:
    runs: int = 0
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    admitted: int = 0
    deferred: int = 0
    refused: int = 0
    refused_by_reason: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    queue_delay_ms_sum: float = 0.0
    queue_delay_ms_max: float = 0.0


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _tally(attempts: Iterable[Any]) -> dict[str, _Usage]:
    """provider -> what the run's attempts used of it."""
    used: dict[str, _Usage] = defaultdict(_Usage)
    for attempt in attempts:
        if not isinstance(attempt, dict):
            continue
        usage = used[str(attempt.get("adapterId") or "")]
        evidence = attempt.get("evidence") or {}
        decision = evidence.get("decision")
        if decision == "admit":
            usage.admitted += 1
            delay = _number(evidence.get("queueDelayMs")) or 0.0
            usage.queue_delay_ms_sum += delay
            usage.queue_delay_ms_max = max(usage.queue_delay_ms_max, delay)
            if delay > 0:
                usage.deferred += 1
        elif decision == "reject":
            usage.refused += 1
            usage.refused_by_reason[str(evidence.get("reason") or "unknown")] += 1
        if attempt.get("sent"):
            usage.calls += 1
            tokens = _number(attempt.get("tokens"))
            usage.tokens += int(tokens) if tokens is not None else 0
            cost = _number(attempt.get("costUsd"))
            if cost is None:
                usage.unpriced_calls += 1
            else:
                usage.cost_usd += cost
    for usage in used.values():
        usage.runs = 1
    return used


def usage_record_run(run: EvaluationRun) -> None:
    """Add a finishing run's attempts to its workspace's hourly usage. Call inside the
    transaction that finishes the run."""
    used = _tally(run.attempts or [])
    if not used:
        return
    hour = _hour(run.finished_at or timezone.now())
    for provider, usage in sorted(used.items()):
        row, _ = UsageHour.objects.select_for_update().get_or_create(
            workspace_id=run.workspace_id,
            hour=hour,
            provider_id=provider,
            principal_id=run.principal_id,
        )
        reasons = dict(row.refused_by_reason or {})
        for reason, count in usage.refused_by_reason.items():
            reasons[reason] = int(reasons.get(reason, 0)) + count
        UsageHour.objects.filter(pk=row.pk).update(
            runs=F("runs") + usage.runs,
            calls=F("calls") + usage.calls,
            tokens=F("tokens") + usage.tokens,
            cost_usd=F("cost_usd") + usage.cost_usd,
            unpriced_calls=F("unpriced_calls") + usage.unpriced_calls,
            admitted=F("admitted") + usage.admitted,
            deferred=F("deferred") + usage.deferred,
            refused=F("refused") + usage.refused,
            refused_by_reason=reasons,
            queue_delay_ms_sum=F("queue_delay_ms_sum") + usage.queue_delay_ms_sum,
            queue_delay_ms_max=max(row.queue_delay_ms_max, usage.queue_delay_ms_max),
        )
    _prune_now_and_then()


def _prune_now_and_then() -> None:
    global _pruned_at
    now = time.monotonic()
    with _prune_lock:
        if now - _pruned_at < _PRUNE_EVERY_SECONDS and _pruned_at:
            return
        _pruned_at = now
    transaction.on_commit(usage_prune)


def usage_prune(now: datetime | None = None) -> int:
    """Remove hours older than the retention (SLUICE_USAGE_RETENTION_DAYS); returns how many."""
    cutoff = (now or timezone.now()) - timedelta(days=float(settings.SLUICE_USAGE_RETENTION_DAYS))
    deleted, _ = UsageHour.objects.filter(hour__lt=_hour(cutoff)).delete()
    return deleted


# ------------------------------------------------------------------------------- selectors


def usage_hours(
    workspace: Workspace,
    start: datetime,
    end: datetime,
    *,
    provider: str | None = None,
    principal: str | None = None,
) -> QuerySet[UsageHour]:
    """The workspace's hourly rows with `start <= hour < end`, oldest first."""
    rows = UsageHour.objects.filter(workspace=workspace, hour__gte=_hour(start), hour__lt=end)
    if provider:
        rows = rows.filter(provider_id=provider)
    if principal:
        rows = rows.filter(principal_id=principal)
    return rows.order_by("hour", "provider_id", "principal_id")


@dataclass(frozen=True)
class UsageTotals:
    """Sums over some rows, grouped by one key (provider, principal or nothing)."""

    key: str
    runs: int
    calls: int
    tokens: int
    cost_usd: float
    unpriced_calls: int
    admitted: int
    deferred: int
    refused: int
    queue_delay_ms_sum: float
    queue_delay_ms_max: float

    @property
    def mean_queue_delay_ms(self) -> float:
        return self.queue_delay_ms_sum / self.admitted if self.admitted else 0.0


_SUMMED = (
    "runs",
    "calls",
    "tokens",
    "cost_usd",
    "unpriced_calls",
    "admitted",
    "deferred",
    "refused",
    "queue_delay_ms_sum",
)


def usage_totals(rows: QuerySet[UsageHour], by: str | None = None) -> list[UsageTotals]:
    """Sums per `by` ("provider_id", "principal_id" or None for one line), largest cost and
    calls first."""
    aggregates = {name: Sum(name) for name in _SUMMED} | {"delay_max": Max("queue_delay_ms_max")}
    base = rows.order_by()
    if by is None:
        whole = base.aggregate(**aggregates)
        found = [dict(whole, key="all")] if whole["calls"] is not None else []
    else:
        found = [dict(row, key=row[by]) for row in base.values(by).annotate(**aggregates)]
    totals = [
        UsageTotals(
            key=str(row["key"]),
            **{name: (row[name] or 0) for name in _SUMMED},
            queue_delay_ms_max=row["delay_max"] or 0.0,
        )
        for row in found
    ]
    totals.sort(key=lambda t: (-t.cost_usd, -t.calls, t.key))
    return totals


def _refusal_reasons(rows: QuerySet[UsageHour]) -> dict[str, int]:
    """Refusals by reason over `rows`, summed in the database where it can read JSON."""
    inner = rows.filter(refused__gt=0).order_by().values("refused_by_reason")
    vendor = connection.vendor
    if vendor in ("postgresql", "sqlite"):
        sql, params = inner.query.sql_with_params()
        each = "jsonb_each_text" if vendor == "postgresql" else "json_each"
        value = "r.value::bigint" if vendor == "postgresql" else "r.value"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT r.key, SUM({value}) FROM ({sql}) AS u, "
                f"{each}(u.refused_by_reason) AS r GROUP BY r.key",
                params,
            )
            return {str(key): int(total) for key, total in cursor.fetchall()}
    reasons: dict[str, int] = defaultdict(int)
    for found in inner:
        for reason, count in (found["refused_by_reason"] or {}).items():
            reasons[reason] += int(count)
    return dict(reasons)


def usage_totals_summed(parts: list[UsageTotals]) -> UsageTotals | None:
    """One line that adds up `parts` (say, the per-provider lines): no second scan."""
    if not parts:
        return None
    return UsageTotals(
        key="all",
        **{name: sum(getattr(part, name) for part in parts) for name in _SUMMED},
        queue_delay_ms_max=max(part.queue_delay_ms_max for part in parts),
    )


def usage_series(rows: QuerySet[UsageHour], start: datetime, end: datetime) -> dict[str, Any]:
    """Per hour from `start` to `end` (every hour, empty ones as 0): calls, tokens, cost,
    refused, admitted and the mean queue delay; and refusals by reason over the range. Summed
    in the database."""
    summed: dict[datetime, dict[str, Any]] = {
        row["hour"]: dict(row)
        for row in rows.order_by()
        .values("hour")
        .annotate(
            calls_=Sum("calls"),
            tokens_=Sum("tokens"),
            cost_=Sum("cost_usd"),
            admitted_=Sum("admitted"),
            refused_=Sum("refused"),
            delay_=Sum("queue_delay_ms_sum"),
        )
    }
    series = []
    at = _hour(start)
    while at < end:
        row: dict[str, Any] = summed.get(at) or {}
        admitted = int(row.get("admitted_") or 0)
        series.append(
            {
                "hour": at,
                "calls": int(row.get("calls_") or 0),
                "tokens": int(row.get("tokens_") or 0),
                "cost_usd": float(row.get("cost_") or 0.0),
                "admitted": admitted,
                "refused": int(row.get("refused_") or 0),
                "mean_queue_delay_ms": float(row.get("delay_") or 0.0) / admitted
                if admitted
                else 0.0,
            }
        )
        at += timedelta(hours=1)
    return {"hours": series, "refused_by_reason": dict(sorted(_refusal_reasons(rows).items()))}


def _csv_row(row: UsageHour) -> list[Any]:
    return [
        row.hour.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        row.provider_id,
        row.principal_id,
        row.runs,
        row.calls,
        row.tokens,
        repr(row.cost_usd),
        row.unpriced_calls,
        row.admitted,
        row.deferred,
        row.refused,
        json.dumps(row.refused_by_reason, sort_keys=True, separators=(",", ":")),
        repr(row.queue_delay_ms_sum),
        repr(row.queue_delay_ms_max),
    ]


def usage_csv(rows: QuerySet[UsageHour]) -> Iterator[str]:
    """The rows as CSV lines (a header first), full precision, for a streaming response."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for row in rows.iterator(chunk_size=2000):
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(_csv_row(row))
        yield buffer.getvalue()


# -------------------------------------------------------------------------------- ranges

RANGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
          "30d": timedelta(days=30)}  # fmt: skip
DEFAULT_RANGE = "24h"
MAX_RANGE = timedelta(days=366)


class UsageRangeError(ValueError):
    """A time range that cannot be read; `field` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _moment(text: str, field: str, *, end: bool) -> datetime:
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            moment = datetime.combine(day, dt.time(), tzinfo=dt.UTC)
            # A date as the end means the whole of that day.
            return moment + timedelta(days=1) if end else moment
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageRangeError(
            field, f"must be a date (YYYY-MM-DD) or an ISO 8601 time, got {text[:40]!r}"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def usage_range(
    *, preset: str = "", start: str = "", end: str = "", now: datetime | None = None
) -> tuple[datetime, datetime, str]:
    """The `[start, end)` of a request: `start`/`end` as dates or ISO times, else a preset
    (`1h`, `24h`, `7d`, `30d`) ending with the current hour. Returns (start, end, preset or
    "custom"); raises `UsageRangeError` naming the parameter."""
    current = _hour(now or timezone.now()) + timedelta(hours=1)
    if start or end:
        first = _moment(start, "start", end=False) if start else current - RANGES[DEFAULT_RANGE]
        last = _moment(end, "end", end=True) if end else current
        if last <= first:
            raise UsageRangeError("end", "must be after start")
        if last - first > MAX_RANGE:
            raise UsageRangeError("end", f"the range may span at most {MAX_RANGE.days} days")
        return first, last, "custom"
    chosen = preset or DEFAULT_RANGE
    if chosen not in RANGES:
        raise UsageRangeError("range", f"must be one of {', '.join(RANGES)}, got {chosen[:20]!r}")
    return current - RANGES[chosen], current, chosen
