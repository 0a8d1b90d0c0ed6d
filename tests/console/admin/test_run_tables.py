"""Read-only run pages render outcomes and load bounds as escaped tables."""

from __future__ import annotations

from types import SimpleNamespace

from django.contrib import admin

from console.admin.runs import EvaluationRunAdmin, LoadRunAdmin
from evaluator.models import EvaluationRun, LoadRun


def test_outcomes_table_is_escaped_and_in_ruleset_order():
    page = EvaluationRunAdmin(EvaluationRun, admin.site)
    run = SimpleNamespace(
        result={
            "decisions": [
                {"decisionId": "first", "status": "succeeded", "output": "<b>yes</b>"},
                {"decisionId": "second", "status": "rate-limited"},
            ]
        }
    )
    html = str(page.outcomes(run))
    assert html.startswith("<table><thead><tr><th>decision</th><th>status</th><th>output</th>")
    assert html.index("first") < html.index("second")
    assert "&lt;b&gt;yes&lt;/b&gt;" in html and "<b>" not in html
    assert "<td>null</td>" in html
    assert page.outcomes(SimpleNamespace(result=None)) == "—"


def test_bounds_table_marks_failures():
    page = LoadRunAdmin(LoadRun, admin.site)
    record = {
        "comparisons": [
            {"bound": "maximumActiveCalls", "observed": 4, "limit": 4, "pass": True},
            {"bound": "maximumQueuedCalls", "observed": 200, "limit": 128, "pass": False},
        ]
    }
    html = str(page.comparisons(SimpleNamespace(record=record)))
    assert "<td>maximumActiveCalls</td><td>4</td><td>4</td><td>pass</td>" in html
    assert "<td>maximumQueuedCalls</td><td>200</td><td>128</td><td>FAIL</td>" in html
    assert page.comparisons(SimpleNamespace(record={})) == "—"
