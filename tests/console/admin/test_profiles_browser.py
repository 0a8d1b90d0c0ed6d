"""The admin workflow in a real headless Chromium, from login to an approved rollback."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from admission.models import ProfileChangeRecord, ProfileVersion, RollbackRequest
from admission.services import profiles as services

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium(chromium_path: str) -> Iterator[Browser]:
    # Keep the ORM outside this block: Playwright's sync API runs an event loop in this thread.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Operator:
    """One person at one browser profile, logged into the admin."""

    def __init__(self, browser: Browser, base_url: str, username: str) -> None:
        self.base_url = base_url
        self.page: Page = browser.new_context(base_url=base_url).new_page()
        self.page.set_default_timeout(20_000)
        self.page.goto("/admin/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", f"{username}-password")
        self.page.click("input[type=submit]")
        expect(self.page.locator("#user-tools")).to_contain_text(username)

    def messages(self) -> Any:
        return self.page.locator("ul.messagelist")

    def propose(self, document: dict[str, Any], *, preview: bool = False) -> None:
        page = self.page
        page.goto("/admin/admission/profileversion/add/")
        page.select_option("#id_workspace", label="acme")
        page.fill("#id_document", json.dumps(document, indent=2))
        if preview:
            page.click("input[name=_preview]")
            expect(page.locator("pre.profile-diff")).to_be_visible()
        page.click("input[name=_propose]")
        expect(self.messages()).to_contain_text(f"Proposed acme:{document['profileVersion']}")

    def run_action(self, changelist: str, row_text: str, action: str) -> None:
        page = self.page
        page.goto(changelist)
        row = page.locator("#result_list tbody tr").filter(
            has=page.get_by_text(re.compile(rf"^{re.escape(row_text)}$"), exact=True)
        )
        expect(row).to_have_count(1)
        row.locator("input.action-select").check()
        page.select_option("select[name=action]", action)
        page.click("button[name=index]")

    def approve_version(self, label: str) -> None:
        self.run_action("/admin/admission/profileversion/", label, "approve_selected")
        page = self.page
        expect(page.locator("#runbook-link")).to_have_text("RUN-JEV-ADMISSION-v1")
        for box in page.locator("#decision_form input[type=checkbox]").all():
            box.check()
        page.fill("#id_comment", f"{label}: capacity and diff checked")
        page.click("#decision-submit")
        expect(self.messages()).to_contain_text(f"Approved acme:{label}.")

    def activate_version(self, label: str, kind: str) -> None:
        self.run_action("/admin/admission/profileversion/", label, "activate_selected")
        expect(self.messages()).to_contain_text(f"Activated acme:{label} ({kind}).")


def test_CNC_ADMIT_AUDIT_admin_workflow_from_login_to_approved_rollback(
    live_server, chromium_path, workspace, proposer, approver, make_document
):
    v1, v2 = make_document("v1"), make_document("v2", concurrency=2)
    with chromium(chromium_path) as browser:
        pat = Operator(browser, live_server.url, "pat")
        alex = Operator(browser, live_server.url, "alex")

        pat.propose(v1)
        alex.approve_version("v1")
        alex.activate_version("v1", "initial")

        pat.propose(v2, preview=True)
        alex.approve_version("v2")
        alex.activate_version("v2", "change")

        pat.run_action("/admin/admission/profileversion/", "v1", "request_rollback")
        pat.page.fill("#id_reason", "v2 starves the quiet principals")
        pat.page.click("#action-submit")
        expect(pat.messages()).to_contain_text("Requested a rollback to acme:v1")

        alex.run_action("/admin/admission/rollbackrequest/", "acme", "approve_rollbacks")
        alex.page.fill("#id_comment", "v2 starves the quiet principals")
        alex.page.click("#decision-submit")
        expect(alex.messages()).to_contain_text("Rolled acme back to v1.")

        alex.page.goto("/admin/admission/profilechangerecord/")
        kinds = alex.page.locator("#result_list tbody td.field-kind")
        expect(kinds).to_have_text(["Rollback", "Change", "Initial"])
        expect(alex.page.locator("#result_list tbody td.field-rollback_reason").first).to_have_text(
            "v2 starves the quiet principals"
        )
        alex.page.click("#changelist-filter a:text-is('Rollback')")
        expect(alex.page.locator("#result_list tbody tr")).to_have_count(1)

        # The approval form's runbook link resolves to the runbook itself.
        alex.page.goto("/runbooks/RUN-JEV-ADMISSION-v1/")
        expect(alex.page.locator("pre#runbook")).to_contain_text("## Checklist")

    records = ProfileChangeRecord.objects.order_by("id")
    assert [r.kind for r in records] == ["initial", "change", "rollback"]
    assert records.last().digest == records.first().digest
    assert RollbackRequest.objects.get().decided_by == approver
    assert RollbackRequest.objects.get().reason == "v2 starves the quiet principals"


def test_change_history_columns_are_readable_at_1280_px(
    live_server, chromium_path, workspace, proposer, approver, approved
):
    v1, v2 = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=v1, actor=approver)
    services.profile_version_activate(version=v2, actor=approver)
    request = services.rollback_request_create(
        workspace=workspace,
        target=v1,
        requested_by=proposer,
        reason="v2 starves the quiet principals whenever the noisy one bursts",
    )
    services.rollback_request_approve(request=request, approver=approver)
    with chromium(chromium_path) as browser:
        alex = Operator(browser, live_server.url, "alex")
        page = alex.page
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto("/admin/admission/profilechangerecord/")
        table = page.locator("#result_list")
        expect(table.locator("tbody tr")).to_have_count(3)
        # Nothing scrolls sideways, and every column ends inside the window.
        overflow = page.evaluate(
            "() => { const box = document.querySelector('.results');"
            " return box.scrollWidth - box.clientWidth; }"
        )
        assert overflow <= 0
        for column in ("short_digest", "actor", "approved_by", "rollback_reason"):
            header = table.locator(f"thead th.column-{column}")
            box = header.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 1280, column
        cells = table.locator("tbody tr").first
        expect(cells.locator("td.field-actor")).to_have_text("alex")
        expect(cells.locator("td.field-approved_by")).to_contain_text("alex")
        expect(cells.locator("td.field-short_digest")).to_have_text(re.compile(r"^[0-9a-f]{12}…$"))


def test_a_document_with_three_problems_shows_all_three_in_the_form(
    live_server, chromium_path, workspace, proposer, make_document
):
    document = make_document("v9")
    document["workspace"]["concurrency"] = 0
    document["providers"]["jev"]["maxQueueWaitMs"] = -1
    document["notes"] = "a key the profile does not have"
    with chromium(chromium_path) as browser:
        pat = Operator(browser, live_server.url, "pat")
        page = pat.page
        page.goto("/admin/admission/profileversion/add/")
        page.select_option("#id_workspace", label="acme")
        page.fill("#id_document", json.dumps(document, indent=2))
        page.click("input[name=_propose]")
        errors = page.locator(".field-document ul.errorlist li")
        expect(errors).to_have_text(
            [
                "notes: unknown key",
                "workspace.concurrency: must be at least 1, got 0",
                "providers.jev.maxQueueWaitMs: must not be negative, got -1",
            ]
        )
        # The document stays in the form to be fixed.
        assert json.loads(page.input_value("#id_document")) == document
    assert not ProfileVersion.objects.exists()


def test_the_admin_guides_the_proposer_and_the_approver(
    live_server, chromium_path, workspace, proposer, approver, make_document, approved
):
    active = approved("v1")
    services.profile_version_activate(version=active, actor=approver)
    approved("v2", concurrency=2)
    services.profile_version_propose(
        workspace=workspace, document=make_document("v3", concurrency=3), proposed_by=proposer
    )
    with chromium(chromium_path) as browser:
        pat = Operator(browser, live_server.url, "pat")
        page = pat.page
        expect(page.locator("#site-name")).to_have_text("Sluice")
        # The proposer asks to approve their own version: refused at once, no checklist.
        pat.run_action("/admin/admission/profileversion/", "v3", "approve_selected")
        expect(pat.messages()).to_have_text(
            "Not offered: you proposed acme:v3, so a second person must decide it "
            "(four-eyes rule of RUN-JEV-ADMISSION-v1)."
        )
        expect(page.locator("#decision_form")).to_have_count(0)
        # On the version's own page the proposer is told why there is no decision to take.
        page.goto("/admin/admission/profileversion/")
        page.click("#result_list a:text-is('v3')")
        expect(page.locator("#version-actions .version-note")).to_contain_text("You proposed")
        expect(page.locator("#version-approve_selected")).to_have_count(0)

        alex = Operator(browser, live_server.url, "alex")
        page = alex.page
        page.goto("/admin/admission/profileversion/")
        filters = page.locator("#changelist-filter")
        expect(filters).to_contain_text("waiting for my decision")
        for status, labels in (("active", ["v1"]), ("approved", ["v2"]), ("proposed", ["v3"])):
            filters.locator(f"a:text-is('{status}')").click()
            expect(page.locator("#result_list tbody th a")).to_have_text(labels)
        page.goto("/admin/admission/profileversion/?inbox=me")
        expect(page.locator("#result_list tbody th a")).to_have_text(["v3"])
        # The decision from the version's own page.
        page.click("#result_list a:text-is('v3')")
        page.click("#version-approve_selected")
        expect(page.locator("#runbook-link")).to_have_text("RUN-JEV-ADMISSION-v1")
        for box in page.locator("#decision_form input[type=checkbox]").all():
            box.check()
        page.fill("#id_comment", "v3: capacity and diff checked")
        page.click("#decision-submit")
        expect(alex.messages()).to_contain_text("Approved acme:v3.")
        page.goto("/admin/admission/profileversion/?inbox=me")
        expect(page.locator("#result_list tbody tr")).to_have_count(0)
        page.goto("/admin/admission/profileversion/")
        page.click("#result_list a:text-is('v2')")
        expect(page.locator("#version-activate_selected")).to_have_text("Activate")
        # Its rollout buttons open the workspace's controls on this version.
        page.click("#version-shadow")
        expect(page.locator("#id_shadow-version option:checked")).to_have_text("v2")
        expect(page.locator("#id_canary-version option:checked")).to_have_text("v2")
        page.go_back()
        page.click("#version-activate_selected")
        expect(alex.messages()).to_contain_text("Activated acme:v2 (change).")


def test_the_structured_editor_and_the_json_write_the_same_document(
    live_server, chromium_path, workspace, proposer, approver, approved, make_document
):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    with chromium(chromium_path) as browser:
        pat = Operator(browser, live_server.url, "pat")
        page = pat.page
        page.goto("/admin/admission/profileversion/add/")
        page.select_option("#id_workspace", label="acme")
        editor = page.locator("#limits-editor")
        expect(editor).to_be_visible()
        document = make_document("v2")
        page.fill("#id_document", json.dumps(document, indent=2))
        page.dispatch_event("#id_document", "input")
        rows = editor.locator("tbody tr")
        expect(rows).to_have_count(1 + len(document["providers"]))
        workspace_row = editor.locator("tr[data-scope=workspace]")
        concurrency = workspace_row.locator("input[data-key=concurrency]")
        expect(concurrency).to_have_value(str(document["workspace"]["concurrency"]))

        # The fields write the JSON ...
        concurrency.fill("7")
        jev = editor.locator("tr[data-scope='providers.jev']")
        jev.locator("input[data-key=maxQueueWaitMs]").fill("")
        jev.locator("input[data-key=requestsPerMinute]").fill("1200")
        written = json.loads(page.input_value("#id_document"))
        expected = make_document("v2")
        expected["workspace"]["concurrency"] = 7
        expected["providers"]["jev"].pop("maxQueueWaitMs", None)
        expected["providers"]["jev"]["requestsPerMinute"] = 1200
        assert written == expected
        # ... and the JSON fills the fields.
        expected["workspace"]["maxQueueLength"] = 33
        page.fill("#id_document", json.dumps(expected, indent=2))
        page.dispatch_event("#id_document", "input")
        expect(workspace_row.locator("input[data-key=maxQueueLength]")).to_have_value("33")
        page.fill("#id_document", "{ not json")
        page.dispatch_event("#id_document", "input")
        expect(editor.locator(".limits-editor-status")).to_contain_text("does not parse")
        page.fill("#id_document", json.dumps(expected, indent=2))
        page.dispatch_event("#id_document", "input")

        # The diff preview stays, and what is proposed is the document both wrote.
        page.click("input[name=_preview]")
        expect(page.locator("pre.profile-diff")).to_contain_text('"concurrency": 7')
        expect(editor).to_be_visible()
        page.click("input[name=_propose]")
        expect(pat.messages()).to_contain_text("Proposed acme:v2")
    assert ProfileVersion.objects.get(profile_version="v2").document == expected
