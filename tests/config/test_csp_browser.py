"""The Content-Security-Policy holds in a real Chromium: the admin and the API docs load and work
with no violation reported, and an inline script injected into a page would not run."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from admission.services import profiles as services
from config.csp import DEFAULT_POLICY
from tests.console.admin.test_profiles_browser import chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every violation the page reports, recorded before any of the page's own scripts run.
WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (event) => {
  window.__violations.push(event.violatedDirective + ' ' + event.blockedURI);
});
"""

ADMIN_PAGES = [
    "/admin/",
    "/admin/admission/profileversion/",
    "/admin/admission/profileversion/add/",
    "/admin/admission/profilechangerecord/",
    "/admin/admission/live/",
    "/admin/evaluator/evaluationrun/",
    "/admin/evaluator/loadrun/",
    "/admin/evaluator/loadrun/add/",
    "/admin/evaluator/evaluationrun/add/",
    "/admin/admission/rolloutevent/",
    "/admin/admission/rolloutevent/controls/acme/",
    "/runbooks/RUN-JEV-ADMISSION-v1/",
]


def test_the_policy_is_sent_on_pages_and_api_answers(client, workspace):
    for path in ("/admin/login/", "/api/workspaces/", "/api/docs/"):
        assert client.get(path)["Content-Security-Policy"] == DEFAULT_POLICY
    assert "script-src 'self'" in DEFAULT_POLICY and "unsafe-eval" not in DEFAULT_POLICY


def _violations(page: Page, console: list[str]) -> list[str]:
    reported = page.evaluate("window.__violations")
    return [*reported, *(line for line in console if "Content Security Policy" in line)]


def test_admin_pages_and_api_docs_load_without_a_violation(
    live_server, chromium_path, workspace, proposer, approver, make_document
):
    version = services.profile_version_propose(
        workspace=workspace, document=make_document("v1"), proposed_by=proposer
    )
    pages = [*ADMIN_PAGES, f"/admin/admission/profileversion/{version.pk}/change/"]
    with chromium(chromium_path) as browser:
        context = browser.new_context(base_url=live_server.url)
        context.add_init_script(WATCH_VIOLATIONS)
        page = context.new_page()
        page.set_default_timeout(20_000)
        console: list[str] = []
        page.on("console", lambda message: console.append(message.text))

        page.goto("/admin/login/")
        page.fill("#id_username", "pat")
        page.fill("#id_password", "pat-password")
        page.click("input[type=submit]")
        expect(page.locator("#user-tools")).to_contain_text("pat")

        seen: dict[str, Any] = {}
        for path in pages:
            response = page.goto(path)
            assert response is not None and response.status == 200, path
            page.wait_for_load_state("load")
            seen[path] = _violations(page, console)
        # The admin's own scripts ran: the action bar's select-all box works.
        page.goto("/admin/admission/profileversion/")
        page.check("#action-toggle")
        expect(page.locator(".action-counter")).to_contain_text("1 of 1 selected")

        page.goto("/api/docs/")
        # Swagger UI started from its script file and rendered the schema.
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("Sluice API")
        expect(page.locator(".opblock").first).to_be_visible()
        seen["/api/docs/"] = _violations(page, console)

        # The policy is enforced: an injected inline script is refused, and reported.
        page.evaluate(
            "() => { const s = document.createElement('script');"
            " s.textContent = 'window.__ran = true'; document.body.appendChild(s); }"
        )
        page.wait_for_function("window.__violations.length > 0")
        assert page.evaluate("window.__ran === undefined")
        context.close()
    assert {path: found for path, found in seen.items() if found} == {}
