"""The operator's dashboard: live admission per provider and per workspace, in the admin.

`/admin/admission/live/` shows, for each workspace the signed-in user may view (and only those):
active and queued calls against their limits, admitted / deferred / shed by reason over the
last hour, the queue delay of admitted requests, breaker states with their transitions, and the
profile revision in force. Figures come from `admission.runtime.operations` (the deployment's shared
state in Redis, or what the one worker publishes when admission is kept in it); charts are
server-rendered SVG (`console.charts.svg`). The page reloads itself.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from admission import access
from admission.runtime import operations
from admission.runtime.operations import CountKey, WorkspaceView
from console.charts.svg import Bar, Series, SvgMarkup, bar_chart, line_chart

__all__ = ["REFRESH_SECONDS", "WINDOW_MINUTES", "dashboard_view"]

REFRESH_SECONDS = 10
WINDOW_MINUTES = 60
CHART_WIDTH = 600
_WORDS = {"admit": "admitted", "defer": "deferred", "reject": "shed"}
_BREAKER_LEVEL = {"closed": 0.0, "half-open": 1.0, "open": 2.0}
_LIMIT_NAMES = (("c", "concurrency"), ("ql", "queue length"), ("rpm", "requests / min"))


@dataclass(frozen=True, slots=True)
class ProviderRow:
    """One provider line of a table: live figures, their limits, the last hour's decisions."""

    provider_id: str
    active: int | None
    concurrency: Any
    queued: int | None
    queue_length: Any
    breaker: str
    failures: int
    admitted: int
    deferred: int
    shed: int
    workspaces: int = 1


@dataclass(slots=True)
class WorkspacePanel:
    view: WorkspaceView
    rows: list[ProviderRow]
    charts: list[SvgMarkup] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)


def _window(view: WorkspaceView) -> dict[CountKey, int]:
    """The last hour's counts, summed over its minutes."""
    summed: dict[CountKey, int] = defaultdict(int)
    for counts in view.counts.values():
        for key, count in counts.items():
            summed[key] += count
    return summed


def _decisions(summed: Mapping[CountKey, int], provider: str | None = None) -> dict[str, int]:
    found = dict.fromkeys(_WORDS, 0)
    for (pid, kind, _), count in summed.items():
        if kind in found and (provider is None or pid == provider):
            found[kind] += count
    return found


def _rows(view: WorkspaceView, summed: Mapping[CountKey, int]) -> list[ProviderRow]:
    rows = []
    for pid, lane in view.providers.items():
        decided = _decisions(summed, pid)
        rows.append(
            ProviderRow(
                pid,
                lane.active,
                lane.limits.get("c"),
                lane.queued,
                lane.limits.get("ql"),
                lane.breaker or ("closed" if view.live else "—"),
                lane.failures,
                decided["admit"],
                decided["defer"],
                decided["reject"],
            )
        )
    return rows


def _live_chart(view: WorkspaceView) -> SvgMarkup:
    bars = []
    scopes: list[tuple[str, Mapping[str, Any], int | None, int | None]] = [
        ("workspace", view.limits, view.active, view.queued)
    ]
    scopes += [(pid, p.limits, p.active, p.queued) for pid, p in view.providers.items()]
    for name, limits, active, queued in scopes:
        for label, value, bound_key in (("active", active, "c"), ("queued", queued, "ql")):
            bound = limits.get(bound_key)
            number = float(bound) if isinstance(bound, int | float) else None
            note = f"of {bound:,}" if number is not None else "(no limit)"
            bars.append(Bar(f"{name} {label}", value, marker=number, note=note))
    return bar_chart(
        bars,
        title="Now: active and queued calls against their limits",
        value_label="calls (tick: the limit)",
        width=CHART_WIDTH,
    )


def _per_minute(views: Iterable[WorkspaceView], now_ms: float, title: str) -> SvgMarkup:
    this_minute = int(now_ms // 60_000) * 60_000
    minutes = [this_minute - step * 60_000 for step in range(WINDOW_MINUTES - 1, -1, -1)]
    totals: dict[str, dict[int, int]] = {kind: defaultdict(int) for kind in _WORDS}
    for view in views:
        for minute, counts in view.counts.items():
            for (_, kind, _), count in counts.items():
                if kind in totals:
                    totals[kind][minute] += count
    series = [
        Series(
            _WORDS[kind],
            [((m - this_minute) / 60_000, float(totals[kind].get(m, 0))) for m in minutes],
            step=True,
        )
        for kind in _WORDS
    ]
    return line_chart(
        series,
        title=title,
        x_label="minutes before now",
        y_label="decisions per minute",
        width=CHART_WIDTH,
    )


def _reasons_chart(summed: Mapping[CountKey, int], several: bool) -> SvgMarkup:
    merged: dict[str, int] = defaultdict(int)
    for (pid, kind, reason), count in summed.items():
        if kind in _WORDS and count:
            label = f"{_WORDS[kind]}: {reason}"
            merged[f"{pid} · {label}" if several else label] += count
    return bar_chart(
        [Bar(label, count) for label, count in sorted(merged.items())],
        title="Admitted, deferred and shed by reason, last hour",
        value_label="decisions",
        width=CHART_WIDTH,
    )


def _delay_chart(summed: Mapping[CountKey, int]) -> SvgMarkup:
    buckets: dict[str, int] = defaultdict(int)
    delay_sum = 0
    for (_, kind, reason), count in summed.items():
        if kind == "delay":
            if reason == "sum":
                delay_sum += count
            else:
                buckets[reason] += count
    total = sum(buckets.values())
    bars = []
    previous = None
    for bound in operations.DELAY_BOUNDS_MS:
        label = f"≤ {_ms(bound)}" if previous is None else f"{_ms(previous)} to {_ms(bound)}"
        bars.append(Bar(label, buckets.get(str(bound), 0)))
        previous = bound
    bars.append(Bar(f"> {_ms(operations.DELAY_BOUNDS_MS[-1])}", buckets.get("inf", 0)))
    mean = f", mean {delay_sum / total:,.0f} ms" if total else ""
    return bar_chart(
        bars if total else [],
        title=f"Queue delay, last hour: {total:,} admitted{mean}",
        value_label="admitted requests",
        width=CHART_WIDTH,
    )


def _ms(value: float) -> str:
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"


def _breaker_chart(view: WorkspaceView) -> SvgMarkup:
    """Each provider's breaker state over the last hour, from its transitions."""
    start = view.now_ms - WINDOW_MINUTES * 60_000
    series = []
    for pid, lane in view.providers.items():
        mine = sorted(
            (t for t in view.transitions if t.get("providerId") == pid),
            key=lambda t: float(t.get("atEpochMs") or 0),
        )
        before = [t for t in mine if float(t.get("atEpochMs") or 0) <= start]
        first = str(before[-1]["to"]) if before else (str(mine[0]["from"]) if mine else None)
        state = first or lane.breaker or "closed"
        points = [(-float(WINDOW_MINUTES), _BREAKER_LEVEL.get(state, 0.0))]
        for transition in mine:
            at = float(transition.get("atEpochMs") or 0)
            if at > start:
                points.append(
                    ((at - view.now_ms) / 60_000, _BREAKER_LEVEL.get(transition["to"], 0))
                )
        points.append((0.0, _BREAKER_LEVEL.get(lane.breaker or "closed", 0.0)))
        series.append(Series(pid, points, step=True))
    return line_chart(
        series,
        title="Breaker state, last hour (0 closed · 1 half-open · 2 open)",
        x_label="minutes before now",
        y_label="state",
        y_max=2.0,
        width=CHART_WIDTH,
    )


def _transition_rows(view: WorkspaceView, limit: int = 12) -> list[dict[str, Any]]:
    rows = []
    for transition in view.transitions[:limit]:
        at = dt.datetime.fromtimestamp(float(transition.get("atEpochMs") or 0) / 1000, dt.UTC)
        rows.append(
            {
                "at": timezone.localtime(at),
                "provider": transition.get("providerId", ""),
                "change": f"{transition.get('from')} → {transition.get('to')}",
                "failures": transition.get("failures", 0),
            }
        )
    return rows


def _panel(view: WorkspaceView) -> WorkspacePanel:
    summed = _window(view)
    panel = WorkspacePanel(view, _rows(view, summed))
    if not view.live:
        return panel
    several = len(view.providers) > 1
    panel.charts = [
        _live_chart(view),
        _per_minute([view], view.now_ms, "Decisions per minute, last hour"),
        _reasons_chart(summed, several),
        _delay_chart(summed),
        _breaker_chart(view),
    ]
    panel.transitions = _transition_rows(view)
    return panel


def _providers(panels: list[WorkspacePanel]) -> list[ProviderRow]:
    """The same table per provider, summed over the shown workspaces."""
    merged: dict[str, dict[str, Any]] = {}
    for panel in panels:
        for row in panel.rows:
            entry = merged.setdefault(
                row.provider_id,
                {"active": None, "c": None, "queued": None, "ql": None, "breakers": []}
                | dict.fromkeys(("admitted", "deferred", "shed", "workspaces"), 0),
            )
            for name, value in (("active", row.active), ("queued", row.queued)):
                if value is not None:
                    entry[name] = (entry[name] or 0) + value
            for name, value in (("c", row.concurrency), ("ql", row.queue_length)):
                if isinstance(value, int | float):
                    entry[name] = (entry[name] or 0) + value
            entry["breakers"].append(row.breaker)
            entry["admitted"] += row.admitted
            entry["deferred"] += row.deferred
            entry["shed"] += row.shed
            entry["workspaces"] += 1
    rows = []
    for pid, entry in sorted(merged.items()):
        states = Counter(entry["breakers"])
        troubled = [f"{states[s]} {s}" for s in ("open", "half-open") if states[s]]
        breaker = ", ".join(troubled) or ("closed" if states["closed"] else "—")
        rows.append(
            ProviderRow(
                pid,
                entry["active"],
                entry["c"],
                entry["queued"],
                entry["ql"],
                breaker,
                0,
                entry["admitted"],
                entry["deferred"],
                entry["shed"],
                entry["workspaces"],
            )
        )
    return rows


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """The page; the admin site's `admin_view` has checked that a staff user is signed in."""
    started = time.perf_counter()
    visible = access.workspaces_for(request.user, access.VIEW).order_by("key")
    chosen = request.GET.get("workspace", "")
    shown = [w for w in visible if w.key == chosen] if chosen else list(visible)
    views = operations.deployment_views(shown, minutes=WINDOW_MINUTES)
    panels = [_panel(view) for view in views]
    live = [view for view in views if view.live]
    now_ms = max((view.now_ms for view in views), default=time.time() * 1000)
    context = {
        **admin.site.each_context(request),
        "title": "Live admission",
        "panels": panels,
        "providers": _providers(panels),
        "summary_chart": _per_minute(live, now_ms, "Decisions per minute, shown workspaces")
        if len(live) > 1
        else None,
        "workspaces": [w.key for w in visible],
        "chosen": chosen,
        "coordinated": any(view.coordinated for view in views),
        "published": any(view.published for view in views),
        "snapshot_seconds": settings.SLUICE_ADMISSION_SNAPSHOT_SECONDS,
        "refresh_seconds": REFRESH_SECONDS,
        "window_minutes": WINDOW_MINUTES,
        "generated_at": timezone.localtime(),
        "elapsed_ms": (time.perf_counter() - started) * 1000,
    }
    return TemplateResponse(request, "admin/admission/dashboard.html", context)
