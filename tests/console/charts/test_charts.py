"""Server-rendered SVG charts: well-formed, escaped, scaled to their data; the load run's set."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from django.utils.html import conditional_escape

from console.charts.load_runs import load_run_charts, load_run_glance
from console.charts.svg import Bar, Reference, Series, bar_chart, line_chart, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)


def texts(root: ET.Element) -> list[str]:
    return ["".join(node.itertext()) for node in root.iter(f"{SVG}text")]


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0, 94, [0, 20, 40, 60, 80, 100]),
        (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0, 990, [0, 200, 400, 600, 800, 1000]),
        (5, 5, [5, 5.2, 5.4, 5.6, 5.8, 6.0]),
    ],
)
def test_ticks_are_round_and_cover_the_range(low, high, expected):
    assert nice_ticks(low, high, 5) == pytest.approx(expected)


def test_ticks_refuse_an_infinite_range():
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0, float("inf"))


def test_line_chart_is_accessible_svg_with_every_label_escaped():
    hostile = '<script>alert("x")</script> & co'
    markup = line_chart(
        [Series(hostile, [(0, 1), (10, 3)])],
        title=f"Calls {hostile}",
        x_label="seconds",
        y_label="calls",
        references=[Reference(f"bound {hostile}", 2)],
    )
    root = parse(markup)
    assert root.tag == f"{SVG}svg"
    assert root.get("role") == "img"
    assert root.get("aria-label") == f"Calls {hostile}"
    assert root.get("viewBox") == "0 0 960 300"
    assert root.find(f"{SVG}title").text == f"Calls {hostile}"
    assert "<script" not in markup and "&lt;script&gt;" in markup
    assert f"bound {hostile}" in texts(root)
    assert all(node.tag != f"{SVG}script" for node in root.iter())
    # Safe for templates as it is: Django does not escape it a second time.
    assert conditional_escape(markup) == markup


def test_steps_hold_each_value_and_gaps_break_the_line():
    markup = line_chart(
        [Series("active", [(0, 0), (1, 4), (2, None), (3, 2), (4, 1)], step=True)],
        title="t",
        x_label="x",
        y_label="y",
    )
    (path,) = [p for p in parse(markup).iter(f"{SVG}path")]
    d = path.get("d")
    assert d.count("M") == 2
    assert re.fullmatch(r"M[\d.,]+H[\d.]+V[\d.]+M[\d.,]+H[\d.]+V[\d.]+", d), d
    assert "L" not in d


def test_line_chart_scales_values_onto_the_plot():
    markup = line_chart(
        [Series("a", [(0, 0), (100, 50)])],
        title="t",
        x_label="x",
        y_label="y",
        references=[Reference("limit", 100)],
    )
    root = parse(markup)
    (path,) = list(root.iter(f"{SVG}path"))
    start, end = re.findall(r"[ML]([\d.]+),([\d.]+)", path.get("d"))
    limit = next(
        node
        for node in root.iter(f"{SVG}line")
        if node.get("stroke-dasharray") and node.get("stroke") != "#0072B2"
    )
    baseline, top = float(start[1]), float(limit.get("y1"))
    # 50 sits halfway between the zero line and the reference at 100.
    assert float(end[1]) == pytest.approx((baseline + top) / 2, abs=0.2)
    assert float(end[0]) > float(start[0])
    assert {"0", "20", "100"} <= set(texts(root))


def test_an_empty_chart_says_so():
    for markup in (
        line_chart([], title="Nothing", x_label="x", y_label="y"),
        line_chart([Series("a", [(0, None)])], title="Nothing", x_label="x", y_label="y"),
    ):
        assert "no data recorded" in texts(parse(markup))
    assert "nothing to show" in texts(parse(bar_chart([], title="None", value_label="n")))


def test_bars_are_proportional_with_markers_and_notes():
    markup = bar_chart(
        [
            Bar("quiet <b>", 1.0, marker=0.5, note="(bound ≥ 0.5)"),
            Bar("noisy", 0.25),
            Bar("absent", None),
        ],
        title="Ratios",
        value_label="ratio",
        x_max=1.0,
    )
    root = parse(markup)
    quiet, noisy = (float(rect.get("width")) for rect in root.iter(f"{SVG}rect"))
    assert noisy / quiet == pytest.approx(0.25, abs=0.01)
    labels = texts(root)
    assert {"quiet <b>", "noisy", "absent", "—", "1 (bound ≥ 0.5)", "0.25"} <= set(labels)
    assert "<b>" not in markup
    (marker,) = [n for n in root.iter(f"{SVG}line") if n.get("stroke-width") == "3"]
    first_rect = next(root.iter(f"{SVG}rect"))
    left = float(first_rect.get("x"))
    assert float(marker.get("x1")) - left == pytest.approx(quiet / 2, abs=0.2)


RECORD = {
    "observations": {
        "arrivals": 100,
        "shed": 7,
        "shedReasons": {"queue-full": 5, "queue-timeout": 2},
        "quietPrincipalAdmissionRatio": 0.98,
        "noisyPrincipalAdmissionRatio": 0.6,
    },
    "comparisons": [
        {"bound": "maximumActiveCalls", "limit": 4, "observed": 4, "pass": True},
        {"bound": "maximumQueuedCalls", "limit": 128, "observed": 90, "pass": True},
        {"bound": "minimumQuietPrincipalAdmissionRatio", "limit": 0.95, "observed": 0.98},
    ],
}
TIMELINE = {
    "stepMs": 500,
    "atMs": [0, 500, 1000],
    "activePeak": [0, 4, 2],
    "queuedPeak": [0, 90, 10],
    "shed": [0, 5, 7],
    "admissionRatio": {"noisy": [None, 0.5, 0.6], "quiet": [None, 1.0, 0.98]},
    "shedByReason": {"queue-full": [0, 5, 5], "queue-timeout": [0, 0, 2]},
}


def test_a_load_run_page_plots_its_timeline_and_record():
    charts = load_run_charts(RECORD, TIMELINE)
    assert len(charts) == 4
    over_time, ratio_lines, ratio_bars, shed = (parse(chart) for chart in charts)
    assert {"active bound 4", "queued bound 128"} <= set(texts(over_time))
    assert "quiet bound ≥ 0.95" in texts(ratio_lines)
    assert "0.98 (bound ≥ 0.95)" in texts(ratio_bars)
    assert "0.6 (no bound)" in texts(ratio_bars)
    assert shed.get("aria-label") == "Shed by reason (7 of 100 arrivals)"
    assert {"queue-full", "queue-timeout", "5", "2"} <= set(texts(shed))


def test_a_run_without_a_timeline_still_charts_its_record():
    charts = load_run_charts(RECORD, None)
    assert [parse(c).get("aria-label") for c in charts] == [
        "Admission ratio per principal class against its bound",
        "Shed by reason (7 of 100 arrivals)",
    ]
    assert load_run_charts(None, None) == []


def test_each_chart_of_a_run_page_comes_with_the_numbers_it_shows():
    capacity, fairness, bars, outcomes = load_run_glance(
        {**RECORD, "observations": {**RECORD["observations"], "maximumQueuedCalls": 90}}, TIMELINE
    )
    assert ("max queued", "90", "≤ 128") in capacity.numbers
    assert ("quiet ratio", "0.98", "≥ 0.95") in fairness.numbers
    assert ("noisy ratio", "0.6", "") in fairness.numbers
    assert bars.numbers == ()
    assert ("arrivals", "100", "") in outcomes.numbers
    assert ("failed", "—", "") in outcomes.numbers
    assert load_run_glance(None, None) == []


def test_a_staged_run_is_plotted_on_real_time():
    over_time = parse(load_run_charts({**RECORD, "mode": "staged-provider"}, TIMELINE)[0])
    assert "seconds (real time) (step 0.5 s)" in texts(over_time)
    offline = parse(load_run_charts({**RECORD, "mode": "offline-fake-provider"}, TIMELINE)[0])
    assert "virtual seconds (step 0.5 s)" in texts(offline)
