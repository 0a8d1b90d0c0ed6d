"""Cancelling evaluation runs from the admin, and a running run's progress on its page, in a real
headless Chromium."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone
from playwright.sync_api import expect

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.models import EvaluationRun, Receipt
from tests.console.admin.test_run_pages_browser import operator, signed_in, workspace
from tests.console.api.test_run_cancel import _receipt_document

__all__ = ["operator", "workspace"]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _run(workspace: Workspace, user, invocation: str, status: str) -> EvaluationRun:
    return EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=user,
        principal_id=user.username,
        invocation_id=invocation,
        document=example_request(3),
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "0" * 64,
        decision_count=3,
        status=status,
        started_at=timezone.now() if status == "running" else None,
    )


def test_the_cancel_action_ends_a_queued_run_from_the_run_list(
    live_server, chromium_path, operator, workspace
):
    queued = _run(workspace, operator, "inv-queued", "queued")
    with signed_in(chromium_path, live_server.url) as page:
        page.goto("/admin/evaluator/evaluationrun/")
        page.check(f'input[name="_selected_action"][value="{queued.pk}"]')
        page.select_option('select[name="action"]', "cancel_runs")
        page.click('button[name="index"]')
        expect(page.locator(".messagelist")).to_contain_text(f"Cancelled evaluation {queued.pk}")
        expect(page.locator("td.field-status")).to_have_text("Cancelled")

    queued.refresh_from_db()
    assert queued.status == "cancelled"
    assert queued.cancel_requested_by == operator
    assert [d["status"] for d in queued.result["decisions"]] == ["cancelled"] * 3
    entry = LogEntry.objects.get(object_id=str(queued.pk))
    assert entry.user == operator
    assert "Cancel requested." in entry.get_change_message()


def test_a_running_runs_page_shows_its_progress_and_cancels_it_with_one_button(
    live_server, chromium_path, operator, workspace
):
    running = _run(workspace, operator, "inv-running", "running")
    document = _receipt_document(running)
    Receipt.objects.create(
        workspace_id=workspace.key,
        principal_id=running.principal_id,
        invocation_id=running.invocation_id,
        ruleset_id=running.ruleset_id,
        ruleset_digest=running.ruleset_digest,
        state="running",
        revision=document["revision"],
        document=document,
    )
    with signed_in(chromium_path, live_server.url) as page:
        page.goto(f"/admin/evaluator/evaluationrun/{running.pk}/change/")
        expect(page.locator(".field-progress .readonly")).to_have_text(
            "1 of 3 decisions done (1 succeeded) · 1 attempts · "
            "1 in flight: check-2 on fake #1 (admission: admit) · at most 1 in flight at once"
        )
        attempts = page.locator(".field-attempts_table tbody tr")
        expect(attempts).to_have_count(1)
        expect(attempts.first).to_contain_text("check-1")
        expect(attempts.first).to_contain_text("admit / admitted")

        page.click("#run-cancel button")
        expect(page.locator(".messagelist")).to_contain_text(
            f"Cancel requested for evaluation {running.pk}"
        )
        page.goto(f"/admin/evaluator/evaluationrun/{running.pk}/change/")
        expect(page.locator(".field-cancel_requested_by .readonly")).to_have_text("olive")
        # Still running until its worker notices; the request is on the row.
        expect(page.locator(".field-status .readonly")).to_have_text("Running")

    running.refresh_from_db()
    assert running.status == "running"
    assert running.cancel_requested_at is not None
    assert running.cancel_requested_by == operator


def test_a_finished_run_offers_no_cancel_and_the_action_reports_it(
    live_server, chromium_path, operator, workspace
):
    done = _run(workspace, operator, "inv-done", "completed")
    with signed_in(chromium_path, live_server.url) as page:
        page.goto(f"/admin/evaluator/evaluationrun/{done.pk}/change/")
        expect(page.locator(".field-status .readonly")).to_have_text("Completed")
        expect(page.locator("#run-cancel")).to_have_count(0)
        page.goto("/admin/evaluator/evaluationrun/")
        page.check(f'input[name="_selected_action"][value="{done.pk}"]')
        page.select_option('select[name="action"]', "cancel_runs")
        page.click('button[name="index"]')
        expect(page.locator(".messagelist .error")).to_contain_text(
            "the run already ended (completed)"
        )
    done.refresh_from_db()
    assert done.status == "completed"
    assert done.cancel_requested_at is None
