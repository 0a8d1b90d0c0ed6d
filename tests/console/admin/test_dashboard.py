"""The operator's dashboard (`/admin/admission/live/`): live admission per provider and per
workspace, from the deployment's shared state in Redis, in a real headless Chromium; members see
their workspaces only; without coordinated admission it says what it cannot show."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client
from playwright.sync_api import expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from admission.core import AdmissionRegistry, AdmissionRejected, AdmissionRequest, Estimate
from admission.models import Workspace
from admission.runtime import registry as runtime
from admission.services import profiles as services
from tests.admission.conftest import ALL_CONFIRMED
from tests.admission.coordination.conftest import SHARED_REDIS

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
BREAKER = {"failureThreshold": 1, "openMs": 600_000, "halfOpenMaxCalls": 1}


def document(label: str, providers: dict[str, Any]) -> dict[str, Any]:
    principal = {"concurrency": 2, "maxQueueLength": 4, "maxQueueWaitMs": 10_000}
    return {
        "profileVersion": label,
        "workspace": {"concurrency": 4, "maxQueueLength": 8, "maxQueueWaitMs": 10_000},
        "providers": providers,
        "principals": {"pat": dict(principal), "alex": dict(principal)},
    }


ACME = document(
    "acme-v1",
    {
        "llm": {
            "concurrency": 1,
            "maxQueueLength": 1,
            "maxQueueWaitMs": 1_500,
            "circuitBreaker": BREAKER,
        },
        "backup": {"concurrency": 2, "maxQueueLength": 4},
    },
)
GLOBEX = document("globex-v1", {"secret-llm": {"concurrency": 3}})


def activate(workspace: Workspace, doc: dict[str, Any], proposer: Any, approver: Any) -> None:
    version = services.profile_version_propose(
        workspace=workspace, document=doc, proposed_by=proposer
    )
    services.profile_version_approve(version=version, approver=approver, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=version, actor=approver)


@pytest.fixture
def coordinated(settings) -> Iterator[str]:
    """Admission shared in Redis under a prefix of this test's own, removed afterwards."""
    prefix = f"dash-{uuid.uuid4().hex[:10]}"
    settings.SLUICE_ADMISSION_REDIS_URL = SHARED_REDIS
    settings.SLUICE_ADMISSION_KEY_PREFIX = prefix
    settings.SLUICE_ADMISSION_RECOVERY_GRACE_MS = 0
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {SHARED_REDIS}")
    runtime.reset_registry(runtime.build_registry)
    yield prefix
    runtime.reset_registry()
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def request(principal: str, provider: str, budget: str, workspace: str = "acme") -> Any:
    return AdmissionRequest(
        budget_id=budget,
        principal_id=principal,
        workspace_id=workspace,
        provider_id=provider,
        estimate=Estimate(),
    )


class Traffic:
    """A worker's admission decisions, made on an event loop of their own: admitted, deferred
    and shed requests, a breaker that opens, and one lease held until `stop`."""

    def __init__(self, registry: AdmissionRegistry) -> None:
        self.registry = registry
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.reasons: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        if not self.ready.wait(30) or self.error is not None:
            raise AssertionError(f"traffic did not get going: {self.error!r}")

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._scenario())
        except BaseException as error:
            self.error = error
            self.ready.set()
        finally:
            self._loop.close()

    async def _shed(self, controller: Any, *args: str) -> None:
        try:
            lease = await controller.acquire(request(*args))
        except AdmissionRejected as rejection:
            self.reasons.append(rejection.reason)
        else:
            lease.release(success=True)
            raise AssertionError(f"{args} was admitted")

    async def _scenario(self) -> None:
        acme = self.registry.controller("acme")
        globex = self.registry.controller("globex")
        assert acme is not None and globex is not None
        (await globex.acquire(request("pat", "secret-llm", "g1", "globex"))).release(success=True)
        held = await acme.acquire(request("pat", "llm", "i1"))
        waiting = asyncio.ensure_future(acme.acquire(request("alex", "llm", "i2")))
        await asyncio.sleep(0.3)
        await self._shed(acme, "pat", "llm", "i3")  # the queue of one is full
        await asyncio.sleep(0.2)
        held.release(success=True)
        second = await asyncio.wait_for(waiting, 10)
        second.release(success=False)  # the breaker opens after one failure
        await asyncio.sleep(0.2)
        await self._shed(acme, "pat", "llm", "i4")  # waits for the open breaker, in vain
        backup = await acme.acquire(request("pat", "backup", "i5"))
        coordinator = acme._coordinator  # type: ignore[attr-defined]
        await coordinator.settle()
        self.ready.set()
        await self._stop.wait()
        backup.release(success=True)
        await coordinator.settle()
        await coordinator.aclose()

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture
def workspaces(proposer, approver, make_user) -> dict[str, Any]:
    """acme and globex, both active; vic views acme only."""
    acme = Workspace.objects.create(key="acme", name="Acme Corp")
    globex = Workspace.objects.create(key="globex", name="Globex Secret Project")
    for workspace in (acme, globex):
        workspace.members.add(proposer, approver, through_defaults={"role": "operator"})
    viewer = make_user("vic")
    acme.members.add(viewer, through_defaults={"role": "viewer"})
    activate(acme, ACME, proposer, approver)
    activate(globex, GLOBEX, proposer, approver)
    return {"acme": acme, "globex": globex, "viewer": viewer}


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_dashboard_shows_the_deployment_live_in_chromium(
    live_server, chromium_path, coordinated, workspaces, tmp_path
):
    traffic = Traffic(runtime.get_registry())
    try:
        # The open breaker holds the next request back until its queue wait runs out.
        assert sorted(traffic.reasons) == ["queue-full", "queue-timeout"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(
                    base_url=live_server.url, viewport={"width": 1280, "height": 900}
                )
                page.set_default_timeout(20_000)
                requested: list[str] = []
                page.on("request", lambda r: requested.append(r.url))
                page.goto("/admin/login/")
                page.fill("#id_username", "vic")
                page.fill("#id_password", "vic-password")
                page.click("input[type=submit]")
                page.click("#live-admission-link a:text-is('Live admission')")
                page.wait_for_url("**/admin/admission/live/")
                page.screenshot(path=str(tmp_path / "live-admission.png"), full_page=True)

                expect(page.locator("#dashboard-refresh")).to_contain_text("every 10 s")
                assert page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "10"
                body = page.locator("#live-admission")
                # vic views acme only: nothing of globex reaches the page.
                expect(page.locator(".live-workspace")).to_have_count(1)
                expect(body).not_to_contain_text("globex")
                expect(body).not_to_contain_text("secret-llm")
                expect(page.locator("#not-coordinated")).to_have_count(0)

                acme = page.locator("#workspace-acme")
                expect(acme.locator("h2")).to_have_text("Workspace acme · profile acme-v1")
                expect(acme.locator(".shared-revision")).to_have_text("acme-v1")
                llm = acme.locator("tr[data-provider=llm] td")
                # provider, active, limit, queued, queue limit, breaker, failures,
                # admitted, deferred, shed
                expect(llm).to_have_text(["llm", "0", "1", "0", "1", "open", "1", "2", "2", "2"])
                backup = acme.locator("tr[data-provider=backup] td")
                expect(backup).to_have_text(
                    ["backup", "1", "2", "0", "4", "closed", "0", "1", "0", "0"]
                )
                per_provider = page.locator("#per-provider tbody tr")
                expect(per_provider).to_have_count(2)
                expect(per_provider.nth(1).locator("td")).to_have_text(
                    ["llm", "1", "0", "1", "0", "1", "1 open", "2", "2", "2"]
                )

                charts = acme.locator("svg.sluice-chart")
                expect(charts).to_have_count(5)
                labels = [charts.nth(i).get_attribute("aria-label") for i in range(5)]
                assert labels[0] == "Now: active and queued calls against their limits"
                assert labels[1] == "Decisions per minute, last hour"
                assert labels[2] == "Admitted, deferred and shed by reason, last hour"
                assert labels[3].startswith("Queue delay, last hour: 3 admitted, mean ")
                assert labels[4].startswith("Breaker state, last hour")
                for reason in (
                    "admitted: admitted",
                    "deferred: concurrency",
                    "deferred: circuit-open",
                    "shed: queue-full",
                    "shed: queue-timeout",
                ):
                    expect(charts.nth(2)).to_contain_text(f"llm · {reason}")
                for index in range(5):
                    box = charts.nth(index).bounding_box()
                    # Readable at 1280 px: drawn at (nearly) its own 600 px, inside the window.
                    assert box is not None and 560 <= box["width"] <= 600, (index, box)
                    assert box["x"] + box["width"] <= 1280
                expect(acme.locator(".breaker-transitions tbody tr").first).to_contain_text("llm")
                expect(acme.locator(".breaker-transitions")).to_contain_text("closed → open")

                # Nobody touches the page: it reloads by itself.
                page.evaluate("window.sluiceMarker = 'before'")
                page.wait_for_event("framenavigated", timeout=20_000)
                page.wait_for_load_state()
                assert page.evaluate("typeof window.sluiceMarker") == "undefined"

                page.goto("/admin/admission/live/?workspace=globex")
                expect(page.locator("#no-workspace")).to_be_visible()
                expect(page.locator(".live-workspace")).to_have_count(0)
            finally:
                browser.close()
        assert all(url.startswith(live_server.url) for url in requested), requested
    finally:
        traffic.stop()
    assert traffic.error is None, traffic.error


@pytest.mark.django_db
def test_without_coordinated_admission_the_dashboard_shows_limits_and_says_why(
    workspaces, settings
):
    settings.SLUICE_ADMISSION_REDIS_URL = ""
    client = Client()
    client.force_login(workspaces["viewer"])
    page = client.get("/admin/admission/live/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="not-coordinated"' in text and "SLUICE_ADMISSION_REDIS_URL" in text
    assert 'id="workspace-acme"' in text and "globex" not in text
    assert 'data-provider="llm"' in text and "sluice-chart" not in text


@pytest.mark.django_db
def test_the_dashboard_is_for_signed_in_staff(workspaces, make_user):
    anonymous = Client().get("/admin/admission/live/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    outsider = make_user("otto", staff=False)
    client = Client()
    client.force_login(outsider)
    assert client.get("/admin/admission/live/").status_code == 302
    staff_stranger = make_user("sam")
    client.force_login(staff_stranger)
    page = client.get("/admin/admission/live/")
    assert page.status_code == 200
    assert 'id="no-workspace"' in page.content.decode()
    assert "acme" not in page.content.decode().split('id="live-admission"')[1]


@pytest.mark.django_db
def test_with_the_admission_redis_away_metrics_and_dashboard_say_so_at_once(workspaces, settings):
    # Nothing listens on port 1: every connection is refused.
    settings.SLUICE_ADMISSION_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.SLUICE_METRICS_ALLOW_FROM = (ipaddress.ip_network("127.0.0.1/32"),)
    scraped = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert scraped.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped.content.decode())
        for s in family.samples
    }
    assert samples[("sluice_admission_coordinated", ())] == 1
    assert samples[("sluice_admission_workspaces", ())] == 2
    assert samples[("sluice_admission_state_unreadable", ())] == 2
    assert samples[("sluice_dependency_up", (("dependency", "redis"),))] == 0
    assert not [name for name, _ in samples if name.startswith("sluice_admission_decisions")]

    client = Client()
    client.force_login(workspaces["viewer"])
    text = client.get("/admin/admission/live/").content.decode()
    assert "No live figures: the admission Redis did not answer (ConnectionError)" in text
    assert 'data-provider="llm"' in text and "sluice-chart" not in text
