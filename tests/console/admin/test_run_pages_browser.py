"""Run pages in a real headless Chromium: an unfinished run's page reloads itself until the run
ends; a load run's page plots its record beside the numbers, with nothing fetched elsewhere."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect, sync_playwright

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.harness.manifests import load_manifest
from evaluator.harness.service import run_manifest
from evaluator.models import EvaluationRun, LoadRun

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MANIFEST = Path(__file__).resolve().parents[3] / "manifests" / "load-manifest.v2.json"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


@pytest.fixture
def operator(django_user_model, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return django_user_model.objects.create_superuser("olive", password="olive-password")


@pytest.fixture
def workspace(operator) -> Workspace:
    workspace = Workspace.objects.create(key="acme", name="Acme Corp")
    workspace.members.add(operator)
    return workspace


@contextlib.contextmanager
def signed_in(chromium_path: str, base_url: str) -> Iterator[Page]:
    # The ORM stays out of this block's thread: Playwright's sync API runs an event loop here.
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(base_url=base_url, viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.goto("/admin/login/")
            page.fill("#id_username", "olive")
            page.fill("#id_password", "olive-password")
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("olive")
            yield page
        finally:
            browser.close()


def in_thread(work: Callable[[], None]) -> None:
    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)


def test_an_unfinished_evaluation_page_reloads_itself_until_the_run_ends(
    live_server, chromium_path, operator, workspace
):
    run = EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=operator,
        principal_id="olive",
        invocation_id="inv-watch",
        document=example_request(1),
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "0" * 64,
        decision_count=1,
        status=EvaluationRun.Status.RUNNING,
        started_at=timezone.now(),
    )

    def finish() -> None:
        EvaluationRun.objects.filter(pk=run.pk).update(
            status=EvaluationRun.Status.COMPLETED,
            finished_at=timezone.now(),
            result={"decisions": [{"decisionId": "check-1", "status": "succeeded"}]},
        )

    with signed_in(chromium_path, live_server.url) as page:
        page.goto(f"/admin/evaluator/evaluationrun/{run.pk}/change/")
        expect(page.locator("#run-refresh")).to_contain_text("This run is running")
        expect(page.locator(".field-duration .readonly")).to_contain_text("s so far")
        expect(page.locator(".field-started_at .readonly")).not_to_have_text("-")
        refresh = page.locator('meta[http-equiv="refresh"]')
        assert refresh.get_attribute("content") == "3"

        # Nobody touches the page: it navigates by itself.
        page.evaluate("window.sluiceMarker = 'before'")
        page.wait_for_event("framenavigated", timeout=10_000)
        page.wait_for_load_state()
        assert page.evaluate("typeof window.sluiceMarker") == "undefined"

        in_thread(finish)
        expect(page.locator(".field-status .readonly")).to_have_text("Completed", timeout=15_000)
        expect(page.locator("#run-refresh")).to_have_count(0)
        expect(page.locator('meta[http-equiv="refresh"]')).to_have_count(0)
        expect(page.locator(".field-outcomes")).to_contain_text("check-1")


def test_a_load_run_page_plots_its_record_beside_the_numbers(
    live_server, chromium_path, operator, workspace, tmp_path
):
    kept: list = []
    record = run_manifest(load_manifest(MANIFEST), "evaluator", keep_timeline=kept.append)
    observations = record["observations"]
    run = LoadRun.objects.create(
        workspace=workspace,
        submitted_by=operator,
        manifest_name=MANIFEST.name,
        target="evaluator",
        status=LoadRun.Status.COMPLETED,
        passed=record["passed"],
        manifest_digest=record["manifest"]["digest"],
        record=record,
        timeline=kept[0],
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    requested: list[str] = []
    with signed_in(chromium_path, live_server.url) as page:
        page.on("request", lambda request: requested.append(request.url))
        page.goto(f"/admin/evaluator/loadrun/{run.pk}/change/")
        page.screenshot(path=str(tmp_path / "load-run.png"), full_page=True)
        glance = page.locator("#run-glance")
        charts = glance.locator("svg.sluice-chart")
        expect(charts).to_have_count(4)
        assert [charts.nth(i).get_attribute("aria-label") for i in range(4)] == [
            "Active and queued calls over the run's timeline",
            "Admission ratio by principal class, running total",
            "Admission ratio per principal class against its bound",
            f"Shed by reason ({observations['shed']:,} of {observations['arrivals']:,} arrivals)",
        ]
        for index in range(4):
            box = charts.nth(index).bounding_box()
            # Drawn at (nearly) its own 600 px, so its 13 px text stays about 13 px.
            assert box is not None and 560 <= box["width"] <= 600, box
        expect(charts.nth(0)).to_contain_text("active bound 4")
        expect(charts.nth(2)).to_contain_text("(bound ≥ 0.95)")
        capacity = glance.locator(".run-numbers").first
        row = capacity.locator("tr", has_text="max queued")
        expect(row.locator("td")).to_have_text([str(observations["maximumQueuedCalls"]), "≤ 128"])
        # Each chart sits beside its numbers at 1280 px.
        chart_box = charts.nth(0).bounding_box()
        numbers_box = capacity.bounding_box()
        assert chart_box is not None and numbers_box is not None
        assert numbers_box["x"] >= chart_box["x"] + chart_box["width"]
        assert numbers_box["x"] + numbers_box["width"] <= 1280
        expect(page.locator("#run-refresh")).to_have_count(0)
    assert requested and all(url.startswith(live_server.url) for url in requested), requested


def test_tables_show_numbers_rounded_for_reading(live_server, chromium_path, operator, workspace):
    evidence = {"decision": "admit", "reason": "admitted", "queueDelayMs": 72.217, "active": 1}
    attempt = {
        "decisionId": "check-1",
        "adapterId": "fake",
        "number": 1,
        "sent": True,
        "outcome": "succeeded",
        "reason": "answered",
        "evidence": evidence,
    }
    run = EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=operator,
        principal_id="olive",
        invocation_id="inv-rounded",
        document=example_request(1),
        status="completed",
        started_at=timezone.now(),
        finished_at=timezone.now(),
        result={"decisions": [{"decisionId": "check-1", "status": "succeeded"}]},
        attempts=[attempt],
    )
    with signed_in(chromium_path, live_server.url) as page:
        page.goto(f"/admin/evaluator/evaluationrun/{run.pk}/change/")
        cells = page.locator(".field-attempts_table tbody tr td")
        expect(cells.nth(6)).to_have_text("72.2")
