"""Usage over time in the admin: `/admin/usage/`.

For one workspace the signed-in user belongs to (any role; principal ids are shown only here,
inside the workspace's own page), over a chosen time range: calls, actual tokens and cost,
admitted, deferred and refused attempts (the deferrals and refusals by reason) and the queue
delay, per hour (per day for ranges over two days) as server-drawn SVG charts, and summed per
provider and per principal. The figures are the aggregates of `evaluator.services.usage`; the
CSV export is the API's (`…/usage.csv`).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from admission import access
from console.admin.kit import refusal_text
from console.charts.svg import Bar, Series, SvgMarkup, bar_chart, line_chart
from evaluator.services import usage

__all__ = ["usage_view"]

CHART_WIDTH = 600
TOP_PRINCIPALS = 50


def _charts(series: dict[str, Any], end: datetime) -> list[SvgMarkup]:
    points = series["points"]
    unit = series["granularity"]
    seconds = 86400.0 if unit == "day" else 3600.0

    def line(name: str, label: str) -> Series:
        return Series(
            label,
            [((p["start"] - end).total_seconds() / seconds, float(p[name])) for p in points],
            step=True,
        )

    x_label = f"{unit}s before the end of the range"
    # Each line chart: its lines (figure, label), its title and its y axis.
    lines = (
        (
            (
                ("calls", "calls sent"),
                ("admitted", "admitted"),
                ("deferred", "deferred"),
                ("refused", "refused"),
            ),
            f"Calls and admission decisions per {unit}",
            "per hour",
        ),
        ((("tokens", "actual tokens"),), f"Actual tokens per {unit}", "tokens"),
        ((("cost_usd", "actual cost"),), f"Actual cost per {unit} (USD)", "USD"),
        (
            (("mean_queue_delay_ms", "mean queue delay"),),
            f"Mean queue delay of admitted calls per {unit} (ms)",
            "ms",
        ),
    )
    charts = [
        line_chart(
            [line(name, label) for name, label in figures],
            title=title,
            x_label=x_label,
            y_label=y_label,
            width=CHART_WIDTH,
        )
        for figures, title, y_label in lines
    ]
    for what in ("deferred", "refused"):
        charts.append(
            bar_chart(
                [Bar(reason, count) for reason, count in series[f"{what}_by_reason"].items()],
                title=f"{what.capitalize()} by reason",
                value_label=f"{what} attempts",
                width=CHART_WIDTH,
            )
        )
    return charts


def usage_view(request: HttpRequest) -> HttpResponse:
    """The page; the admin site's `admin_view` has checked that a staff user is signed in."""
    started = time.perf_counter()
    visible = list(access.workspaces_for(request.user, access.VIEW).order_by("key"))
    chosen = request.GET.get("workspace", "") or (visible[0].key if visible else "")
    workspace = next((w for w in visible if w.key == chosen), None)
    context: dict[str, Any] = {
        **admin.site.each_context(request),
        "title": "Usage",
        "workspaces": [w.key for w in visible],
        "chosen": chosen,
        "workspace": workspace,
        "ranges": list(usage.RANGES),
        "provider": request.GET.get("provider", ""),
    }
    try:
        start, end, preset = usage.usage_range_from(request.GET)
    except usage.UsageRangeError as error:
        start, end, preset = usage.usage_range()
        context["range_error"] = refusal_text(error)
    context.update(start=start, end=end, preset=preset)
    if workspace is not None:
        rows = usage.usage_rows(workspace, start, end, provider=context["provider"] or None)
        providers = usage.usage_totals(usage.usage_rows(workspace, start, end), "provider_id")
        if context["provider"]:
            total = usage.usage_totals_summed(
                [p for p in providers if p.key == context["provider"]]
            )
        else:
            total = usage.usage_totals_summed(providers)
        series = usage.usage_series(rows, start, end)
        principals = usage.usage_totals(rows, "principal_id")
        query = {"start": start.isoformat(), "end": end.isoformat()}
        if context["provider"]:
            query["provider"] = context["provider"]
        context.update(
            total=total,
            providers=providers,
            principals=principals[:TOP_PRINCIPALS],
            more_principals=max(0, len(principals) - TOP_PRINCIPALS),
            charts=_charts(series, end),
            granularity=series["granularity"],
            deferred_by_reason=series["deferred_by_reason"],
            refused_by_reason=series["refused_by_reason"],
            csv_url=reverse("workspace-usage-csv", kwargs={"workspace_key": workspace.key})
            + "?"
            + urlencode(query),
        )
    context["elapsed_ms"] = (time.perf_counter() - started) * 1000
    return TemplateResponse(request, "admin/evaluator/usage.html", context)
