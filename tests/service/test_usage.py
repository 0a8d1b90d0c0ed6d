"""Usage over time on a real deployment: after runs with known token usage and price at a
loopback provider, the hourly aggregates equal the sums of the actuals reconciled on release
(the runs' own attempts say what they were), attempts deferred for a known reason (one
principal's two runs at once against its concurrency) count under that reason, the CSV export
reads back to the same figures,
the admin's usage page renders in Chromium at 1280 px, and members of another workspace see
nothing of it."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.service.conftest import demo_provider_over_http

pytestmark = [pytest.mark.celery, pytest.mark.browser]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PRICE = 0.0000125
OUTSIDER = """
from django.contrib.auth import get_user_model
from admission.models import Workspace, WorkspaceMembership
from knox.models import AuthToken
user = get_user_model().objects.create_user("olga", password="olga-password-1", is_staff=True)
other = Workspace.objects.create(key="globex", name="Globex")
WorkspaceMembership.objects.create(workspace=other, user=user, role="operator")
print(AuthToken.objects.create(user=user)[1])
"""


def document(decisions: int, text: str, *, parallel: bool = False) -> dict:
    doc = example_request(decisions)
    doc["input"]["text"] = text
    if parallel:
        # Up to the principal's concurrency (2) at once.
        doc["scheduler"] = {"enabled": True, "bindingConcurrency": 4}
    for decision in doc["ruleset"]["decisions"]:
        decision["binding"]["primary"]["costPerTokenUsd"] = PRICE
    return doc


@pytest.mark.parametrize("mode", ["embedded", "full"], indirect=True)
def test_usage_aggregates_equal_the_reconciled_actuals(deployment, chromium_path, tmp_path):
    with LoopbackServer() as provider:
        # Slow enough that the proposer's two runs overlap and wait for its permits.
        provider.default = Reply(content="yes", total_tokens=37, delay=0.4)
        env = {"SLUICE_ADAPTERS": demo_provider_over_http(provider.base_url)}
        deployment.start_web(env)
        deployment.start_worker(env)
        submitted = [
            (deployment.submit(document(3, "a", parallel=True))["id"], "demo-proposer"),
            (deployment.submit(document(2, "b", parallel=True))["id"], "demo-proposer"),
            (deployment.submit(document(4, "c"), user="demo-approver")["id"], "demo-approver"),
        ]
        runs = [(deployment.wait_run(run_id), who) for run_id, who in submitted]

    expected: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    deferred_by: dict[str, int] = defaultdict(int)
    for run, who in runs:
        assert run["status"] == "completed", run
        for attempt in run["attempts"]:
            for reason in attempt.get("deferredBy") or []:
                deferred_by[reason] += 1
            expected[who]["deferred"] += bool(attempt.get("deferredBy"))
            assert attempt["tokens"] == 37 and math.isclose(attempt["costUsd"], 37 * PRICE)
            expected[who]["calls"] += attempt["sent"]
            expected[who]["tokens"] += attempt["tokens"]
            expected[who]["costUsd"] += attempt["costUsd"]
    assert expected["demo-proposer"]["calls"] == 5 and expected["demo-approver"]["calls"] == 4

    summary = deployment.api("GET", "/api/workspaces/demo/usage/?range=24h")
    assert summary.status_code == 200, summary.text
    found = summary.json()
    assert set(found["principals"]) == {"demo-proposer", "demo-approver"}
    for who, sums in expected.items():
        mine = found["principals"][who]
        assert (mine["calls"], mine["tokens"]) == (sums["calls"], sums["tokens"])
        assert math.isclose(mine["costUsd"], sums["costUsd"], rel_tol=1e-12)
        assert mine["admitted"] == sums["calls"] and mine["refused"] == 0
    assert found["totals"]["calls"] == 9 and found["providers"]["fake"]["tokens"] == 9 * 37
    assert found["granularity"] == "hour"
    assert sum(hour["calls"] for hour in found["hours"]) == 9 and len(found["hours"]) == 24
    # Deferred for the known reason: the proposer's four calls at once against its two permits.
    assert set(deferred_by) == {"concurrency"} and deferred_by["concurrency"] >= 2, deferred_by
    assert found["deferredByReason"] == dict(deferred_by)
    assert found["principals"]["demo-proposer"]["deferred"] == expected["demo-proposer"]["deferred"]
    assert found["totals"]["deferred"] == sum(e["deferred"] for e in expected.values())
    assert sum(hour["deferred"] for hour in found["hours"]) == found["totals"]["deferred"]
    # Read day by day, a week says the same.
    week = deployment.api("GET", "/api/workspaces/demo/usage/?range=7d").json()
    assert week["granularity"] == "day" and len(week["days"]) in (7, 8)
    assert week["deferredByReason"] == found["deferredByReason"]
    assert week["totals"] == found["totals"]

    # The CSV export reads back to the same figures, every digit of the cost kept.
    exported = deployment.api("GET", "/api/workspaces/demo/usage.csv?range=24h")
    assert exported.status_code == 200 and exported.headers["content-type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    per_principal: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    exported_deferrals: dict[str, int] = defaultdict(int)
    for row in rows:
        assert row["provider"] == "fake"
        for reason, count in json.loads(row["deferred_by_reason"]).items():
            exported_deferrals[reason] += count
        per_principal[row["principal"]]["tokens"] += int(row["tokens"])
        per_principal[row["principal"]]["costUsd"] += float(row["cost_usd"])
    assert exported_deferrals == deferred_by
    for who in expected:
        assert per_principal[who]["tokens"] == found["principals"][who]["tokens"]
        assert math.isclose(per_principal[who]["costUsd"], found["principals"][who]["costUsd"])

    # Bad ranges are typed errors naming the parameter.
    bad = deployment.api("GET", "/api/workspaces/demo/usage/?start=yesterday")
    assert bad.status_code == 400 and "start" in bad.json()["error"]["fields"]

    # A member of another workspace sees nothing of this one.
    token = deployment.django(OUTSIDER).strip().splitlines()[-1]
    headers = {"Authorization": f"Token {token}"}
    for path in ("/api/workspaces/demo/usage/", "/api/workspaces/demo/usage.csv"):
        refused = httpx.get(deployment.web_url + path, headers=headers, timeout=30)
        assert refused.status_code == 404, refused.text
    own = httpx.get(
        deployment.web_url + "/api/workspaces/globex/usage/", headers=headers, timeout=30
    )
    assert own.status_code == 200 and own.json()["totals"] is None
    assert "demo-proposer" not in own.text

    proposer = next(u for u in deployment.demo["users"] if u["username"] == "demo-proposer")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(
                base_url=deployment.web_url, viewport={"width": 1280, "height": 900}
            )
            page.set_default_timeout(20_000)
            page.goto("/admin/login/")
            page.fill("#id_username", "demo-proposer")
            page.fill("#id_password", proposer["password"])
            page.click("input[type=submit]")
            # The admin is styled: its static files are served as in production (WhiteNoise).
            stylesheet = page.request.get("/static/admin/css/base.css")
            assert stylesheet.status == 200, stylesheet.status
            assert stylesheet.headers["content-type"].startswith("text/css")
            header = "getComputedStyle(document.querySelector('#header')).backgroundColor"
            assert page.evaluate(header) not in ("rgba(0, 0, 0, 0)", "transparent")
            page.click("a:text-is('Usage')")
            page.wait_for_url("**/admin/usage/**")
            page.screenshot(path=str(tmp_path / "usage.png"), full_page=True)
            expect(page.locator("#usage-summary")).to_contain_text("9 calls")
            expect(page.locator("#usage-summary")).to_contain_text("333 tokens")
            charts = page.locator("svg.sluice-chart")
            expect(charts).to_have_count(6)
            for index in range(6):
                box = charts.nth(index).bounding_box()
                assert box is not None and box["x"] + box["width"] <= 1280, (index, box)
            row = page.locator("#usage-principals tr[data-principal=demo-approver] td")
            expect(row.nth(2)).to_have_text("4")
            expect(row.nth(3)).to_have_text("148")
            reason = page.locator(
                "#usage-reasons tr[data-decision=deferred][data-reason=concurrency]"
            )
            expect(reason.locator("td").nth(2)).to_have_text(str(deferred_by["concurrency"]))
            expect(charts.nth(4)).to_contain_text("concurrency")
            page.select_option("#id_range", "7d")
            page.click("#usage-range input[type=submit]")
            expect(page.locator("#usage-summary")).to_contain_text("9 calls")
            page.goto("/admin/usage/?workspace=globex")
            expect(page.locator("#no-workspace")).to_be_visible()

            outsider = browser.new_page(base_url=deployment.web_url)
            outsider.goto("/admin/login/")
            outsider.fill("#id_username", "olga")
            outsider.fill("#id_password", "olga-password-1")
            outsider.click("input[type=submit]")
            outsider.goto("/admin/usage/?workspace=demo")
            expect(outsider.locator("#no-workspace")).to_be_visible()
            expect(outsider.locator("#usage")).not_to_contain_text("demo-proposer")
            outsider.goto("/admin/usage/")
            expect(outsider.locator("#usage-summary")).to_contain_text("Workspace globex")
            expect(outsider.locator("#usage")).not_to_contain_text("demo-proposer")
        finally:
            browser.close()
