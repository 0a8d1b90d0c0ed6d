"""Live figures with admission kept in one process: the worker's tally counts its registry's
decisions, queue delays and breaker transitions like the shared state in Redis does, its
publisher writes them with the live active and queued figures, and the views operators read
(`admission.runtime.operations`, `/metrics`) show them, without a principal id anywhere."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from admission.core import AdmissionRejected, AdmissionRequest, Estimate
from admission.models import AdmissionSnapshot, Workspace
from admission.runtime import live, operations
from admission.runtime import registry as runtime
from admission.services import profiles as services
from config import metrics
from tests.admission.conftest import ALL_CONFIRMED

BREAKER = {"failureThreshold": 1, "openMs": 600_000, "halfOpenMaxCalls": 1}
PROFILE = {
    "profileVersion": "acme-v1",
    "workspace": {"concurrency": 4, "maxQueueLength": 8, "maxQueueWaitMs": 10_000},
    "providers": {
        "llm": {
            "concurrency": 1,
            "maxQueueLength": 1,
            "maxQueueWaitMs": 10_000,
            "circuitBreaker": BREAKER,
        },
        "backup": {"concurrency": 2, "maxQueueLength": 4},
    },
    "principals": {
        "pat-7f3a": {"concurrency": 2, "maxQueueLength": 4},
        "alex-9c1d": {"concurrency": 2, "maxQueueLength": 4},
    },
}
PRINCIPALS = ("pat-7f3a", "alex-9c1d")


def ask(principal: str, provider: str, budget: str) -> AdmissionRequest:
    return AdmissionRequest(
        budget_id=budget,
        principal_id=principal,
        workspace_id="acme",
        provider_id=provider,
        estimate=Estimate(),
    )


@pytest.fixture
def acme(proposer, approver) -> Workspace:
    workspace = Workspace.objects.create(key="acme", name="Acme")
    workspace.members.add(proposer, approver, through_defaults={"role": "operator"})
    version = services.profile_version_propose(
        workspace=workspace, document=PROFILE, proposed_by=proposer
    )
    services.profile_version_approve(version=version, approver=approver, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=version, actor=approver)
    return workspace


async def traffic(held: list[Any]) -> list[str]:
    """Two admitted at once, one admitted after waiting, one shed (queue full), one refused as
    unconfigured, one failure that opens llm's breaker; a backup lease stays held."""
    controller = runtime.get_registry().controller("acme")
    assert controller is not None
    reasons = []
    first = await controller.acquire(ask("pat-7f3a", "llm", "b1"))
    waiting = asyncio.ensure_future(controller.acquire(ask("alex-9c1d", "llm", "b2")))
    await asyncio.sleep(0.05)
    for request in (ask("pat-7f3a", "llm", "b3"), ask("pat-7f3a", "ghost", "b4")):
        try:
            await controller.acquire(request)
        except AdmissionRejected as rejection:
            reasons.append(rejection.reason)
    first.release(success=True)
    second = await asyncio.wait_for(waiting, 5)
    second.release(success=False)
    held.append(await controller.acquire(ask("alex-9c1d", "backup", "b5")))
    return reasons


@pytest.mark.django_db
def test_published_figures_reach_the_views_and_metrics_without_ids(acme, settings):
    settings.SLUICE_METRICS_ALLOW_FROM = ()
    loop = asyncio.new_event_loop()
    publisher = live.LivePublisher("worker-1", loop, interval=60)
    publisher.tally.attach(runtime.get_registry())
    held: list[Any] = []
    try:
        reasons = loop.run_until_complete(traffic(held))
        assert reasons == ["queue-full", "unconfigured-provider"]
        # The loop is not running: the publisher collects on this thread.
        publisher.publish()
    finally:
        for lease in held:
            lease.release(success=True)
        loop.close()

    row = AdmissionSnapshot.objects.get(process_id="worker-1")
    figures = row.state["acme"]
    assert figures["rev"] == "acme-v1"
    totals = dict(figures["totals"])
    delays = {
        k.split("|")[2]: totals.pop(k)
        for k in list(totals)
        if "|delay|" in k and k.startswith("llm")
    }
    assert totals == {
        "llm|admit|admitted": 2,
        "llm|defer|concurrency": 1,
        "llm|reject|queue-full": 1,
        "ghost|reject|unconfigured-provider": 1,
        "backup|admit|admitted": 1,
        "backup|delay|0": 1,
        "llm|transition|closed>open": 1,
    }
    # One admitted at once, one after waiting about 50 ms for the first to finish.
    waited = delays.pop("sum")
    assert delays.pop("0") == 1 and list(delays.values()) == [1]
    assert int(next(iter(delays))) >= 25 and 40 <= waited <= int(next(iter(delays)))
    assert figures["providers"]["backup"] | {"a": 1, "q": 0} == figures["providers"]["backup"]
    assert figures["providers"]["llm"]["breaker"] == "open"
    assert figures["providers"]["llm"]["failures"] == 1
    assert figures["workspace"] == {"a": 1, "q": 0}
    assert (figures["leases"], figures["waiters"], figures["principals"]) == (1, 0, 2)
    (transition,) = figures["transitions"]
    assert (transition["providerId"], transition["from"], transition["to"]) == (
        "llm",
        "closed",
        "open",
    )

    (view,) = operations.deployment_views(minutes=60)
    assert view.live and view.published and not view.coordinated and view.publishers == 1
    assert view.providers["llm"].breaker == "open" and view.providers["backup"].active == 1
    assert view.totals[("llm", "admit", "admitted")] == 2
    assert sum(view.counts[minute][("llm", "admit", "admitted")] for minute in view.counts) == 2

    page = metrics.render().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    admitted = (("decision", "admit"), ("provider", "llm"), ("reason", "admitted"))
    assert samples[("sluice_admission_decisions_total", admitted)] == 2
    assert samples[("sluice_admission_active_calls", (("provider", "backup"),))] == 1
    assert samples[("sluice_admission_processes", ())] == 1
    assert samples[("sluice_admission_queue_delay_seconds_count", (("provider", "llm"),))] == 2
    assert "pat-7f3a" not in page and "alex-9c1d" not in page and "acme" not in page
    assert all("acme" not in str(key) for key in row.state["acme"])
    assert not any(principal in str(row.state) for principal in PRINCIPALS)


@pytest.mark.django_db
def test_counts_outlive_the_process_and_live_figures_only_come_from_fresh_rows(acme, settings):
    settings.SLUICE_ADMISSION_SNAPSHOT_SECONDS = 1.0
    now = timezone.now()
    minute = str(int(now.timestamp() // 60) * 60_000)
    old = {"acme": {"rev": "acme-v1", "totals": {"llm|admit|admitted": 5},
                    "counts": {minute: {"llm|admit|admitted": 5}},
                    "providers": {"llm": {"a": 3, "q": 2, "breaker": "open"}}}}  # fmt: skip
    new = {"acme": {"rev": "acme-v1", "totals": {"llm|admit|admitted": 2},
                    "counts": {minute: {"llm|admit|admitted": 2}},
                    "providers": {"llm": {"a": 1, "q": 0, "breaker": "closed"}}}}  # fmt: skip
    AdmissionSnapshot.objects.create(
        process_id="gone", written_at=now - timedelta(minutes=5), state=old
    )
    AdmissionSnapshot.objects.create(process_id="alive", written_at=now, state=new)
    AdmissionSnapshot.objects.create(
        process_id="ancient", written_at=now - timedelta(days=2), state=old
    )
    merged = live.published_states(minutes=60)["acme"]
    assert merged["totals"] == {"llm|admit|admitted": 7}
    assert merged["counts"] == {minute: {"llm|admit|admitted": 7}}
    assert merged["providers"]["llm"] == {"a": 1, "q": 0, "breaker": "closed"}
    assert merged["processes"] == 1

    # With every row stale the counts stay and the live figures are idle.
    AdmissionSnapshot.objects.filter(process_id="alive").update(
        written_at=now - timedelta(minutes=1)
    )
    (view,) = operations.deployment_views(minutes=60)
    assert view.live and view.publishers == 0
    assert view.totals[("llm", "admit", "admitted")] == 7
    assert view.providers["llm"].active == 0 and view.providers["llm"].breaker == "closed"

    # Publishing prunes rows gone for more than a day.
    loop = asyncio.new_event_loop()
    try:
        live.LivePublisher("alive", loop, interval=60).publish()
    finally:
        loop.close()
    assert set(AdmissionSnapshot.objects.values_list("process_id", flat=True)) == {"gone", "alive"}
