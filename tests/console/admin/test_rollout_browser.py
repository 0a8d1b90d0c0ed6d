"""The rollout controls in a real headless Chromium: kill switch, shadow with its comparison
page, canary started and abandoned; every page fits 1280 px."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from admission.models import RolloutEvent
from admission.services import profiles as services
from admission.services import rollout
from tests.console.admin.test_profiles_browser import Operator, chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONTROLS = "/admin/admission/rolloutevent/controls/acme/"


def _fits(page, width: int = 1280) -> None:
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0


def test_rollout_controls_in_a_browser(
    live_server, chromium_path, workspace, proposer, approver, approved
):
    current, candidate = approved("v1"), approved("v2", concurrency=2)
    services.profile_version_activate(version=current, actor=approver)
    with chromium(chromium_path) as browser:
        pat = Operator(browser, live_server.url, "pat")
        page = pat.page
        page.set_viewport_size({"width": 1280, "height": 900})

        # From the admin index to the controls of acme.
        page.goto("/admin/admission/rolloutevent/controls/")
        page.click("#rollout-workspaces a:text-is('acme')")
        expect(page.locator("#kill-switch")).to_contain_text("allowed")
        _fits(page)

        # The kill switch needs a reason, then holds.
        page.click("#submit-switch")
        expect(pat.messages()).to_contain_text("needs a reason")
        page.fill("#form-switch textarea", "provider latency doubled")
        page.click("#submit-switch")
        expect(pat.messages()).to_contain_text("Kill switch on")
        expect(page.locator("#kill-switch .switch-off")).to_have_text("off")
        page.click("#submit-switch")
        expect(pat.messages()).to_contain_text("allowed again")

        # A shadow of v2.
        page.select_option("#id_shadow-version", label="v2")
        page.fill("#id_shadow-reason", "compare queue bounds")
        page.click("#submit-shadow_start")
        expect(pat.messages()).to_contain_text("Started v2 as the shadow")
        # Nothing ran yet: no verdict, and no table pretending to one.
        expect(page.locator("#shadow")).to_contain_text("No run observed yet: nothing to judge.")
        expect(page.locator("#shadow table.rollout-verdicts")).to_have_count(0)
        page.click("#shadow a:text-is('Comparison with plots')")
        expect(page.locator("h1")).to_contain_text("Shadow v2 against the active profile")
        _fits(page)

        # A canary for one principal and a tenth of the other runs, then abandoned.
        page.goto(CONTROLS)
        page.select_option("#id_canary-version", label="v2")
        page.fill("#id_canary-principals", "quiet-1")
        page.fill("#id_canary-fraction", "0.1")
        page.click("#submit-canary_start")
        expect(page.locator("#canary")).to_contain_text(
            "principals quiet-1 and 10% of the other runs"
        )
        page.fill("#id_abandon-reason", "not today")
        page.click("#submit-canary_abandon")
        expect(pat.messages()).to_contain_text("Abandoned the canary")
        expect(page.locator("#recent-events tbody tr")).to_have_count(5)
        _fits(page)

    assert rollout.canary_current(workspace=workspace) is None
    assert rollout.shadow_current(workspace=workspace).version == candidate
    assert list(RolloutEvent.objects.order_by("id").values_list("kind", flat=True)) == [
        "parallel-off",
        "parallel-on",
        "shadow-start",
        "canary-start",
        "canary-abandon",
    ]
