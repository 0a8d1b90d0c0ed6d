"""The embedded default shows admission live: with admission kept in the one worker process (no
Redis), after evaluations `/metrics` has admission decision series with non-zero counts and the
admin's Live admission page, in a real Chromium, shows the admitted figures and its charts; no
series carries an id."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import demo_provider_over_http, wait_for

pytestmark = [pytest.mark.celery, pytest.mark.browser]

TOKEN = "metrics-token-0c5e61d2aa"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def samples(deployment) -> dict[tuple[str, tuple], float]:
    response = httpx.get(
        deployment.web_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(found, name: str, **labels: str) -> float:
    return sum(v for (n, k), v in found.items() if n == name and labels.items() <= dict(k).items())


@pytest.mark.parametrize("mode", ["embedded"])
def test_embedded_admission_is_live_in_metrics_and_on_the_page(deployment, chromium_path, tmp_path):
    env = {"SLUICE_METRICS_TOKEN": TOKEN, "SLUICE_ADMISSION_SNAPSHOT_SECONDS": "0.5"}
    deployment.start_web(env)
    deployment.start_worker(env)
    runs = [deployment.submit(example_request(4))["id"] for _ in range(3)]
    for run_id in runs:
        assert deployment.wait_run(run_id)["status"] == "completed"

    found: dict = {}

    def published() -> bool:
        nonlocal found
        found = samples(deployment)
        return total(found, "sluice_admission_decisions_total", decision="admit") >= 12

    wait_for(published, 30, "the worker's admissions in /metrics")
    assert total(found, "sluice_admission_coordinated") == 0
    assert total(found, "sluice_admission_processes") == 1
    admitted = total(found, "sluice_admission_decisions_total", provider="fake", decision="admit")
    assert admitted == 12
    assert total(found, "sluice_admission_queue_delay_seconds_count", provider="fake") == admitted
    assert total(found, "sluice_admission_limit", provider="fake", limit="concurrency") == 4
    labels = [value for _, pairs in found for _, value in pairs]
    proposer = next(u for u in deployment.demo["users"] if u["username"] == "demo-proposer")
    for value in labels:
        assert value != "demo" and "demo-" not in value, value
        assert not any(run_id in value for run_id in runs), value

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
            page.goto("/admin/admission/live/")
            page.screenshot(path=str(tmp_path / "live-embedded.png"), full_page=True)
            expect(page.locator("#not-coordinated")).to_have_count(0)
            expect(page.locator("#published-figures")).to_contain_text("every 0.5 s")
            demo = page.locator("#workspace-demo")
            expect(demo.locator(".shared-revision")).to_have_text("demo-v1")
            cells = demo.locator("tr[data-provider=fake] td")
            # provider, active, limit, queued, queue limit, breaker, failures, admitted, ...
            expect(cells.nth(0)).to_have_text("fake")
            expect(cells.nth(2)).to_have_text("4")
            expect(cells.nth(5)).to_have_text("closed")
            expect(cells.nth(7)).to_have_text("12")
            charts = demo.locator("svg.sluice-chart")
            expect(charts).to_have_count(5)
            assert (
                charts.nth(3)
                .get_attribute("aria-label")
                .startswith("Queue delay, last hour: 12 admitted")
            )
            expect(charts.nth(2)).to_contain_text("admitted: admitted")
        finally:
            browser.close()


CANARY = """
from config.demo import demo_profile, demo_version_approve
# The canary admits one call at a time in the whole workspace; the active version four.
demo_version_approve(demo_profile("demo-canary", concurrency=1))
print("ok")
"""


@pytest.mark.parametrize("mode", ["embedded"])
def test_a_canarys_decisions_are_in_the_embedded_live_figures(deployment, chromium_path):
    """Both demo users' runs go to a canary that admits one call at a time: the second run's
    calls wait on the canary's limit (the active version's four permits never make them wait),
    and those deferrals are in /metrics and on Live admission beside the admissions, each
    attempt admitted once."""
    env = {"SLUICE_METRICS_TOKEN": TOKEN, "SLUICE_ADMISSION_SNAPSHOT_SECONDS": "0.5"}
    with LoopbackServer() as provider:
        provider.default = Reply(content="yes", total_tokens=12, delay=0.3)
        env["SLUICE_ADAPTERS"] = demo_provider_over_http(provider.base_url)
        assert deployment.django(CANARY).strip().endswith("ok")
        deployment.start_web(env)
        started = deployment.api(
            "POST",
            "/api/workspaces/demo/canary/",
            json={"version": "demo-canary", "principals": ["demo-proposer", "demo-approver"]},
        )
        assert started.status_code == 201, started.text
        deployment.start_worker(env)
        runs = [
            deployment.submit(example_request(4))["id"],
            deployment.submit(example_request(4), user="demo-approver")["id"],
        ]
        finished = [deployment.wait_run(run_id) for run_id in runs]
    waited = 0
    for run in finished:
        assert run["status"] == "completed" and run["profileVersion"] == "demo-canary", run
        waited += sum("concurrency" in (a.get("deferredBy") or []) for a in run["attempts"])
    assert waited > 0, "the canary's one permit made some calls wait"

    found: dict = {}

    def published() -> bool:
        nonlocal found
        found = samples(deployment)
        deferred = total(
            found, "sluice_admission_decisions_total", decision="defer", reason="concurrency"
        )
        return deferred >= waited

    wait_for(published, 30, "the canary's deferrals in /metrics")
    admitted = total(found, "sluice_admission_decisions_total", provider="fake", decision="admit")
    # Every attempt counted once, though a canary attempt is admitted on both sides.
    assert admitted == 8
    assert total(found, "sluice_admission_decisions_total", decision="reject") == 0
    for _, pairs in found:
        for _, value in pairs:
            assert "demo-" not in value, value
    deferred = total(found, "sluice_admission_decisions_total", provider="fake", decision="defer")

    # Live admission says the same in the browser.
    proposer = next(u for u in deployment.demo["users"] if u["username"] == "demo-proposer")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(base_url=deployment.web_url)
            page.set_default_timeout(20_000)
            page.goto("/admin/login/")
            page.fill("#id_username", "demo-proposer")
            page.fill("#id_password", proposer["password"])
            page.click("input[type=submit]")
            page.goto("/admin/admission/live/")
            cells = page.locator("#workspace-demo tr[data-provider=fake] td")
            # ..., admitted, deferred, shed
            expect(cells.nth(7)).to_have_text("8")
            expect(cells.nth(8)).to_have_text(f"{deferred:.0f}")
        finally:
            browser.close()
