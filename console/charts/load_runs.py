"""The charts of a load run's page, drawn from its record and the timeline kept beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from console.charts.svg import Bar, Reference, Series, SvgMarkup, bar_chart, line_chart
from console.templatetags.readable import readable_number
from evaluator.harness.records import MODE_STAGED

__all__ = ["BoundRow", "Glance", "load_run_bounds", "load_run_charts", "load_run_glance"]

# The admin's content column at 1280 px leaves about 900 px: a chart and its numbers side by side.
CHART_WIDTH = 600

# The principal class whose admission ratio a manifest bounds from below.
_RATIO_BOUNDS = {"quiet": "minimumQuietPrincipalAdmissionRatio"}


def _points(seconds: list[float], values: list[Any]) -> list[tuple[float, Any]]:
    # A timeline's columns are aligned by construction; a short one is drawn as far as it goes.
    return list(zip(seconds, values, strict=False))


def _limits(record: Mapping[str, Any]) -> dict[str, Any]:
    return {c["bound"]: c["limit"] for c in record.get("comparisons") or [] if "bound" in c}


def _seconds_label(record: Mapping[str, Any]) -> str:
    # A staged-provider run keeps real time; every other path runs on virtual time.
    return "seconds (real time)" if record.get("mode") == MODE_STAGED else "virtual seconds"


def _over_time(
    timeline: Mapping[str, Any], limits: Mapping[str, Any], seconds_label: str
) -> SvgMarkup:
    seconds = [at / 1000.0 for at in timeline["atMs"]]
    references = [
        Reference(f"{label} bound {limits[bound]:,}", float(limits[bound]))
        for bound, label in (
            ("maximumActiveCalls", "active"),
            ("maximumQueuedCalls", "queued"),
        )
        if isinstance(limits.get(bound), int | float)
    ]
    return line_chart(
        [
            Series("active calls (peak per step)", _points(seconds, timeline["activePeak"]), True),
            Series("queued calls (peak per step)", _points(seconds, timeline["queuedPeak"]), True),
        ],
        title="Active and queued calls over the run's timeline",
        x_label=f"{seconds_label} (step {timeline['stepMs'] / 1000:g} s)",
        y_label="calls",
        references=references,
        width=CHART_WIDTH,
    )


def _ratio_over_time(
    timeline: Mapping[str, Any], limits: Mapping[str, Any], seconds_label: str
) -> SvgMarkup:
    seconds = [at / 1000.0 for at in timeline["atMs"]]
    ratios = timeline.get("admissionRatio") or {}
    references = [
        Reference(f"{name} bound ≥ {limits[bound]:g}", float(limits[bound]))
        for name, bound in _RATIO_BOUNDS.items()
        if name in ratios and isinstance(limits.get(bound), int | float)
    ]
    return line_chart(
        [Series(f"{name} principals", _points(seconds, values)) for name, values in ratios.items()],
        title="Admission ratio by principal class, running total",
        x_label=seconds_label,
        y_label="admitted / arrived",
        references=references,
        y_max=1.0,
        width=CHART_WIDTH,
    )


def _ratio_bars(observations: Mapping[str, Any], limits: Mapping[str, Any]) -> SvgMarkup:
    bars = []
    for name, key in (
        ("quiet", "quietPrincipalAdmissionRatio"),
        ("noisy", "noisyPrincipalAdmissionRatio"),
    ):
        limit = limits.get(_RATIO_BOUNDS.get(name, ""))
        bound = float(limit) if isinstance(limit, int | float) else None
        bars.append(
            Bar(
                f"{name} principals",
                observations.get(key),
                marker=bound,
                note=f"(bound ≥ {bound:g})" if bound is not None else "(no bound)",
            )
        )
    return bar_chart(
        bars,
        title="Admission ratio per principal class against its bound",
        value_label="ratio",
        x_max=1.0,
        width=CHART_WIDTH,
    )


def _shed_bars(observations: Mapping[str, Any]) -> SvgMarkup:
    reasons = observations.get("shedReasons") or {}
    return bar_chart(
        [Bar(reason, count) for reason, count in sorted(reasons.items())],
        title=f"Shed by reason ({observations.get('shed', 0):,} of "
        f"{observations.get('arrivals', 0):,} arrivals)",
        value_label="arrivals shed",
        width=CHART_WIDTH,
    )


def load_run_charts(
    record: Mapping[str, Any] | None, timeline: Mapping[str, Any] | None
) -> list[SvgMarkup]:
    """The run page's charts; those over time need the timeline, the others only the record."""
    if not record:
        return []
    limits = _limits(record)
    observations = record.get("observations") or {}
    charts = []
    if timeline and timeline.get("atMs"):
        label = _seconds_label(record)
        charts += [_over_time(timeline, limits, label), _ratio_over_time(timeline, limits, label)]
    charts += [_ratio_bars(observations, limits), _shed_bars(observations)]
    return charts


@dataclass(frozen=True, slots=True)
class Glance:
    """One chart of the run page and the numbers beside it: (name, observed, bound) rows."""

    chart: SvgMarkup
    numbers: tuple[tuple[str, str, str], ...] = ()


def _figure(value: Any, unit: str = "", *, beside: Any = None) -> str:
    """`value` rounded for reading; more digits only where rounding would make it read as
    the bound `beside` while it differs from it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    text = readable_number(value)
    if isinstance(beside, int | float) and value != beside and text == readable_number(beside):
        text = f"{value:,.6g}"
    return f"{text} {unit}".strip()


def _row(
    name: str,
    observations: Mapping[str, Any],
    key: str,
    limits: Mapping[str, Any] | None = None,
    bound: str = "",
    unit: str = "",
) -> tuple[str, str, str]:
    limit = (limits or {}).get(bound)
    sign = "≥" if bound.startswith("minimum") else "≤"
    shown_bound = f"{sign} {_figure(limit, unit)}" if limit is not None else ""
    return (name, _figure(observations.get(key), unit, beside=limit), shown_bound)


def load_run_glance(
    record: Mapping[str, Any] | None, timeline: Mapping[str, Any] | None
) -> list[Glance]:
    """The run page's charts, each with the record's numbers it illustrates."""
    charts = load_run_charts(record, timeline)
    if not charts or record is None:
        return []
    o = record.get("observations") or {}
    lim = _limits(record)
    capacity = (
        _row("max active", o, "maximumActiveCalls", lim, "maximumActiveCalls"),
        _row("max queued", o, "maximumQueuedCalls", lim, "maximumQueuedCalls"),
        _row(
            "max lane wait", o, "maximumEligibleLaneWaitMs", lim, "maximumEligibleLaneWaitMs", "ms"
        ),
        _row("virtual time", o, "virtualDurationMs", unit="ms"),
    )
    fairness = (
        _row(
            "quiet ratio",
            o,
            "quietPrincipalAdmissionRatio",
            lim,
            "minimumQuietPrincipalAdmissionRatio",
        ),
        _row("noisy ratio", o, "noisyPrincipalAdmissionRatio"),
        _row("retry ampl.", o, "retryAmplificationRatio", lim, "maximumRetryAmplificationRatio"),
    )
    outcomes = tuple(
        _row(name, o, name) for name in ("arrivals", "completed", "shed", "failed", "cancelled")
    )
    numbers = [capacity, fairness, (), outcomes] if len(charts) == 4 else [fairness, outcomes]
    return [Glance(chart, rows) for chart, rows in zip(charts, numbers, strict=True)]


@dataclass(frozen=True, slots=True)
class BoundRow:
    """One bound of a record for reading: its figures rounded (the record keeps them whole)."""

    bound: str
    observed: str
    limit: str
    passed: bool


def load_run_bounds(record: Mapping[str, Any] | None) -> list[BoundRow]:
    """The record's bounds in its order, each observed value and limit rounded for reading."""
    return [
        BoundRow(
            str(item.get("bound", "")),
            _figure(item.get("observed"), beside=item.get("limit")),
            _figure(item.get("limit")),
            bool(item.get("pass")),
        )
        for item in (record or {}).get("comparisons") or []
    ]
