"""Usage over time: hourly aggregates per workspace, provider and principal.

When an evaluation run finishes, `usage_record_run` adds its attempts to the `UsageHour` rows of
the hour it finished and their roll-up (`usage_roll_up`) to the `UsageDay` rows of that UTC
day, in the transaction that finishes it (so a run counts once, and a day is always the sum of
its hours): calls sent, the
actual tokens and cost that were reconciled with admission on release, admitted attempts,
deferred attempts (those that waited in the admission queue, admitted or not) by the reasons
they were deferred for (the attempt's `deferredBy`), refused attempts by reason, and the
admitted queue delay. Whole days older than `SLUICE_USAGE_RETENTION_DAYS` are removed, hours and
days together. The selectors below read them for the admin's usage page, the REST API and the
CSV export: ranges up to `DAY_ROWS_AFTER` hour by hour, longer ones day by day (whole days from
`UsageDay`, the hours at either end from `UsageHour`).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, QuerySet, Sum
from django.utils import timezone

from admission.core import ServiceError
from admission.models import Workspace
from evaluator.models import EvaluationRun, UsageDay, UsageFigures, UsageHour

__all__ = [
    "CSV_COLUMNS",
    "DAY_ROWS_AFTER",
    "UsageRows",
    "UsageTotals",
    "usage_csv",
    "usage_hours",
    "usage_prune",
    "usage_reasons",
    "usage_record_run",
    "usage_roll_up",
    "usage_rows",
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
    "deferred_by_reason",
    "refused",
    "refused_by_reason",
    "queue_delay_ms_sum",
    "queue_delay_ms_max",
)
# Ranges longer than this are read day by day.
DAY_ROWS_AFTER = timedelta(days=2)
# An attempt that waited before this was recorded (no `deferredBy`) counts under this reason.
UNRECORDED = "unrecorded"
_PRUNE_EVERY_SECONDS = 3600.0
_pruned_at = 0.0
_prune_lock = threading.Lock()


def _hour(at: datetime) -> datetime:
    return at.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def _day(at: datetime) -> datetime:
    return at.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _day_after(at: datetime) -> datetime:
    """The first midnight at or after `at`."""
    day = _day(at)
    return day if day == at else day + timedelta(days=1)


# The figures that add up from hours to days (and from rows to totals); the reasons merge and
# the largest queue delay is kept.
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
_REASONS = ("deferred_by_reason", "refused_by_reason")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _deferred_by(attempt: dict[str, Any], evidence: dict[str, Any]) -> list[str]:
    """The reasons an attempt was deferred for; one that waited before they were recorded
    counts under `UNRECORDED`."""
    reasons = attempt.get("deferredBy")
    if isinstance(reasons, list) and reasons:
        return [str(reason) for reason in dict.fromkeys(reasons)]
    if "deferredBy" not in attempt and (_number(evidence.get("queueDelayMs")) or 0.0) > 0:
        return [UNRECORDED]
    return []


def _counted(reasons: dict[str, int], reason: str) -> None:
    reasons[reason] = reasons.get(reason, 0) + 1


def _tally(run: EvaluationRun, hour: datetime) -> list[UsageHour]:
    """What the run's attempts used of each provider in `hour` (unsaved rows), in provider
    order."""
    used: dict[str, UsageHour] = {}
    for attempt in run.attempts or []:
        if not isinstance(attempt, dict):
            continue
        provider = str(attempt.get("adapterId") or "")
        usage = used.get(provider)
        if usage is None:
            usage = used[provider] = UsageHour(
                workspace_id=run.workspace_id,
                hour=hour,
                provider_id=provider,
                principal_id=run.principal_id,
                runs=1,
            )
        evidence = attempt.get("evidence") or {}
        decision = evidence.get("decision")
        if decision == "admit":
            usage.admitted += 1
            delay = _number(evidence.get("queueDelayMs")) or 0.0
            usage.queue_delay_ms_sum += delay
            usage.queue_delay_ms_max = max(usage.queue_delay_ms_max, delay)
        elif decision == "reject":
            usage.refused += 1
            _counted(usage.refused_by_reason, str(evidence.get("reason") or "unknown"))
        deferred_by = _deferred_by(attempt, evidence)
        if deferred_by:
            usage.deferred += 1
            for reason in deferred_by:
                _counted(usage.deferred_by_reason, reason)
        if attempt.get("sent"):
            usage.calls += 1
            tokens = _number(attempt.get("tokens"))
            usage.tokens += int(tokens) if tokens is not None else 0
            cost = _number(attempt.get("costUsd"))
            if cost is None:
                usage.unpriced_calls += 1
            else:
                usage.cost_usd += cost
    return [used[provider] for provider in sorted(used)]


def _add_to(into: UsageFigures, added: UsageFigures) -> None:
    """Add `added`'s figures to `into`'s."""
    for name in _SUMMED:
        setattr(into, name, getattr(into, name) + getattr(added, name))
    for name in _REASONS:
        merged = {str(k): int(v) for k, v in (getattr(into, name) or {}).items()}
        for reason, count in (getattr(added, name) or {}).items():
            merged[reason] = merged.get(reason, 0) + count
        setattr(into, name, merged)
    into.queue_delay_ms_max = max(into.queue_delay_ms_max, added.queue_delay_ms_max)


def usage_roll_up(hours: Iterable[UsageHour]) -> list[UsageDay]:
    """The days of some hours (unsaved rows): per UTC day, provider and principal, the sum of
    their hours, as `UsageDay` keeps it. In the order each day first appears."""
    days: dict[tuple[datetime, str, str], UsageDay] = {}
    for hour in hours:
        day = _day(hour.hour)
        key = (day, hour.provider_id, hour.principal_id)
        into = days.get(key)
        if into is None:
            into = days[key] = UsageDay(
                workspace_id=hour.workspace_id,
                day=day,
                provider_id=hour.provider_id,
                principal_id=hour.principal_id,
            )
        _add_to(into, hour)
    return list(days.values())


def _add(added: UsageHour | UsageDay) -> None:
    """Add an unsaved row's figures to the stored row of its period, locked."""
    model = type(added)
    period = "hour" if model is UsageHour else "day"
    row, _ = model.objects.select_for_update().get_or_create(  # type: ignore[attr-defined]
        workspace_id=added.workspace_id,
        provider_id=added.provider_id,
        principal_id=added.principal_id,
        **{period: getattr(added, period)},
    )
    _add_to(row, added)
    row.save(update_fields=[*_SUMMED, *_REASONS, "queue_delay_ms_max"])


def usage_record_run(run: EvaluationRun) -> None:
    """Add a finishing run's attempts to its workspace's hourly and daily usage. Call inside
    the transaction that finishes the run."""
    finished = run.finished_at or timezone.now()
    hours = _tally(run, _hour(finished))
    if not hours:
        return
    # Hours first, then days, each in provider order: concurrent runs lock rows in one order.
    rows: list[UsageHour | UsageDay] = [*hours, *usage_roll_up(hours)]
    for added in rows:
        _add(added)
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
    """Remove the days (and their hours) that ended more than the retention ago
    (SLUICE_USAGE_RETENTION_DAYS), whole days only; returns how many rows went."""
    cutoff = (now or timezone.now()) - timedelta(days=float(settings.SLUICE_USAGE_RETENTION_DAYS))
    with transaction.atomic():
        hours, _ = UsageHour.objects.filter(hour__lt=_day(cutoff)).delete()
        days, _ = UsageDay.objects.filter(day__lt=_day(cutoff)).delete()
    return hours + days


# ------------------------------------------------------------------------------- selectors


def _filtered(rows: QuerySet[Any], provider: str | None, principal: str | None) -> QuerySet[Any]:
    if provider:
        rows = rows.filter(provider_id=provider)
    if principal:
        rows = rows.filter(principal_id=principal)
    return rows


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
    return _filtered(rows, provider, principal).order_by("hour", "provider_id", "principal_id")


@dataclass(frozen=True)
class UsageRows:
    """The rows that make up a range: with `granularity` "hour" every hour from `hours`;
    with "day" the whole days from `days` and the hours before the first and after the last
    whole day from `hours`."""

    start: datetime
    end: datetime
    granularity: str
    hours: QuerySet[UsageHour]
    days: QuerySet[UsageDay] | None = None

    def parts(self) -> list[QuerySet[Any]]:
        return [self.hours] if self.days is None else [self.days, self.hours]


def usage_rows(
    workspace: Workspace,
    start: datetime,
    end: datetime,
    *,
    provider: str | None = None,
    principal: str | None = None,
) -> UsageRows:
    """The rows of `[start, end)`: hour by hour up to `DAY_ROWS_AFTER`, else day by day."""
    start = _hour(start)
    first_day, last_day = _day_after(start), _day(end)
    if end - start <= DAY_ROWS_AFTER or last_day <= first_day:
        hours = usage_hours(workspace, start, end, provider=provider, principal=principal)
        return UsageRows(start, end, "hour", hours)
    days = UsageDay.objects.filter(workspace=workspace, day__gte=first_day, day__lt=last_day)
    edges = UsageHour.objects.filter(workspace=workspace, hour__gte=start, hour__lt=end).exclude(
        hour__gte=first_day, hour__lt=last_day
    )
    return UsageRows(
        start,
        end,
        "day",
        _filtered(edges, provider, principal),
        _filtered(days, provider, principal),
    )


def _parts(rows: UsageRows | QuerySet[Any]) -> list[QuerySet[Any]]:
    return rows.parts() if isinstance(rows, UsageRows) else [rows]


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


def usage_totals(rows: UsageRows | QuerySet[Any], by: str | None = None) -> list[UsageTotals]:
    """Sums per `by` ("provider_id", "principal_id" or None for one line), largest cost and
    calls first."""
    aggregates = {name: Sum(name) for name in _SUMMED} | {"delay_max": Max("queue_delay_ms_max")}
    summed: dict[str, dict[str, Any]] = {}
    for part in _parts(rows):
        base = part.order_by()
        if by is None:
            whole = base.aggregate(**aggregates)
            found = [dict(whole, key="all")] if whole["calls"] is not None else []
        else:
            found = [dict(row, key=row[by]) for row in base.values(by).annotate(**aggregates)]
        for row in found:
            into = summed.setdefault(str(row["key"]), {name: 0 for name in _SUMMED} | {"max": 0.0})
            for name in _SUMMED:
                into[name] += row[name] or 0
            into["max"] = max(into["max"], row["delay_max"] or 0.0)
    totals = [
        UsageTotals(
            key=key,
            **{name: row[name] for name in _SUMMED},
            queue_delay_ms_max=row["max"],
        )
        for key, row in summed.items()
    ]
    totals.sort(key=lambda t: (-t.cost_usd, -t.calls, t.key))
    return totals


def _reasons(rows: QuerySet[Any], column: str, count: str) -> dict[str, int]:
    """`column` (a reason -> count JSON) summed over `rows`, in the database where it can read
    JSON."""
    inner = rows.filter(**{f"{count}__gt": 0}).order_by().values(column)
    vendor = connection.vendor
    if vendor in ("postgresql", "sqlite"):
        sql, params = inner.query.sql_with_params()
        each = "jsonb_each_text" if vendor == "postgresql" else "json_each"
        value = "r.value::bigint" if vendor == "postgresql" else "r.value"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT r.key, SUM({value}) FROM ({sql}) AS u, "
                f"{each}(u.{column}) AS r GROUP BY r.key",
                params,
            )
            return {str(key): int(total) for key, total in cursor.fetchall()}
    reasons: dict[str, int] = defaultdict(int)
    for found in inner:
        for reason, n in (found[column] or {}).items():
            reasons[reason] += int(n)
    return dict(reasons)


def usage_reasons(rows: UsageRows | QuerySet[Any]) -> dict[str, dict[str, int]]:
    """`{"deferred": {reason: attempts}, "refused": {reason: attempts}}` over the rows, each
    sorted by reason. An attempt deferred for two reasons counts under both."""
    found: dict[str, dict[str, int]] = {"deferred": {}, "refused": {}}
    for part in _parts(rows):
        for kind in found:
            for reason, n in _reasons(part, f"{kind}_by_reason", kind).items():
                found[kind][reason] = found[kind].get(reason, 0) + n
    return {kind: dict(sorted(reasons.items())) for kind, reasons in found.items()}


def usage_totals_summed(parts: list[UsageTotals]) -> UsageTotals | None:
    """One line that adds up `parts` (say, the per-provider lines): no second scan."""
    if not parts:
        return None
    return UsageTotals(
        key="all",
        **{name: sum(getattr(part, name) for part in parts) for name in _SUMMED},
        queue_delay_ms_max=max(part.queue_delay_ms_max for part in parts),
    )


_SERIES = {
    "calls_": Sum("calls"),
    "tokens_": Sum("tokens"),
    "cost_": Sum("cost_usd"),
    "admitted_": Sum("admitted"),
    "deferred_": Sum("deferred"),
    "refused_": Sum("refused"),
    "delay_": Sum("queue_delay_ms_sum"),
}


def usage_series(
    rows: UsageRows | QuerySet[UsageHour], start: datetime, end: datetime
) -> dict[str, Any]:
    """Per hour (or per day, for rows read day by day) from `start` to `end`, every period
    and empty ones as 0: calls, tokens, cost, admitted, deferred, refused and the mean queue
    delay; and the deferrals and refusals by reason over the range. Summed in the database.
    Returns `{"granularity", "points": [{"start", ...}], "deferred_by_reason",
    "refused_by_reason"}`."""
    daily = isinstance(rows, UsageRows) and rows.granularity == "day"
    floor = _day if daily else _hour
    step = timedelta(days=1) if daily else timedelta(hours=1)
    summed: dict[datetime, dict[str, Any]] = defaultdict(lambda: defaultdict(float))
    for part in _parts(rows):
        period = "day" if part.model is UsageDay else "hour"
        for found in part.order_by().values(period).annotate(**_SERIES):
            into = summed[floor(found[period])]
            for name in _SERIES:
                into[name] += found[name] or 0
    points = []
    at = floor(start)
    while at < end:
        row: dict[str, Any] = summed.get(at) or {}
        admitted = int(row.get("admitted_") or 0)
        points.append(
            {
                "start": at,
                "calls": int(row.get("calls_") or 0),
                "tokens": int(row.get("tokens_") or 0),
                "cost_usd": float(row.get("cost_") or 0.0),
                "admitted": admitted,
                "deferred": int(row.get("deferred_") or 0),
                "refused": int(row.get("refused_") or 0),
                "mean_queue_delay_ms": float(row.get("delay_") or 0.0) / admitted
                if admitted
                else 0.0,
            }
        )
        at += step
    reasons = usage_reasons(rows)
    return {
        "granularity": "day" if daily else "hour",
        "points": points,
        "deferred_by_reason": reasons["deferred"],
        "refused_by_reason": reasons["refused"],
    }


def _reasons_text(reasons: dict[str, Any] | None) -> str:
    return json.dumps(reasons or {}, sort_keys=True, separators=(",", ":"))


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
        _reasons_text(row.deferred_by_reason),
        row.refused,
        _reasons_text(row.refused_by_reason),
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


class UsageRangeError(ServiceError, ValueError):
    """A time range that cannot be read; `field` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


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


def usage_range_from(query: Mapping[str, Any]) -> tuple[datetime, datetime, str]:
    """`usage_range` of a request's query parameters (`range`, `start`, `end`), as the admin's
    page and the API read them."""
    return usage_range(
        preset=str(query.get("range") or ""),
        start=str(query.get("start") or ""),
        end=str(query.get("end") or ""),
    )
